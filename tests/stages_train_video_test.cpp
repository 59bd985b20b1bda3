// Training on video windows: per-frame timesteps (SANA-Video's chunks and image-to-video
// conditioning) in the flow-matching noise and loss, and TrainStep on the video transformer:
// every remedy's gradients equal the plain ones, and image-to-video leaves latent frame 0 out.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "model/common/lora.h"
#include "model/sana_video/sana_video_transformer.h"
#include "stages/train/flow_matching.h"
#include "stages/train/train_data.h"
#include "stages/train/train_step.h"
#include "train_test_util.h"

namespace {

using sf::model::SanaVideoTransformer;
using sf::model::SanaVideoTransformerConfig;
using sf::train::FrameTimesteps;

at::Generator seeded(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// [B, 8, f, 4, 6] video latents.
at::Tensor video_latents(int64_t batch, int64_t frames) {
    torch::manual_seed(5);
    return torch::randn({batch, 8, frames, 4, 6});
}

TEST(FlowMatchingFrames, EachChunkOfFramesDrawsItsOwnTimestep) {
    const sf::train::FlowMatchingConfig c;
    at::Generator g = seeded(1);
    FrameTimesteps frames;
    frames.chunk_starts = {0, 2, 4};
    const auto noised = sf::train::flow_matching_noise(video_latents(2, 5), c, g, frames);
    ASSERT_EQ(noised.timesteps.sizes(), (at::IntArrayRef{2, 5}));
    for (int64_t b = 0; b < 2; ++b) {
        const at::Tensor t = noised.timesteps[b];
        EXPECT_EQ(t[0].item<float>(), t[1].item<float>());
        EXPECT_EQ(t[2].item<float>(), t[3].item<float>());
        EXPECT_NE(t[1].item<float>(), t[2].item<float>());
        EXPECT_NE(t[3].item<float>(), t[4].item<float>());  // the last chunk is frame 4 alone
    }
    EXPECT_FALSE(noised.frame_weights.defined());
    // Each frame is noised at its own sigma.
    const at::Tensor x0 = video_latents(2, 5);
    const at::Tensor noise = noised.target + x0;
    const at::Tensor sig = noised.sigmas.view({2, 1, 5, 1, 1});
    EXPECT_TRUE(torch::allclose(noised.noisy, (1 - sig) * x0 + sig * noise, 1e-5, 1e-6));
    // Starts past the window are ignored: a 2-frame window has chunks {0}, {1}... of {0, 1, 4}.
    at::Generator g2 = seeded(1);
    frames.chunk_starts = {0, 1, 4};
    const auto short_window = sf::train::flow_matching_noise(video_latents(1, 2), c, g2, frames);
    EXPECT_EQ(short_window.timesteps.sizes(), (at::IntArrayRef{1, 2}));
}

TEST(FlowMatchingFrames, OneTimestepPerSampleDrawsWhatItAlwaysDrew) {
    const sf::train::FlowMatchingConfig c;
    const at::Tensor x = video_latents(2, 3);
    at::Generator g1 = seeded(7), g2 = seeded(7), g3 = seeded(7);
    const auto plain = sf::train::flow_matching_noise(x, c, g1);
    FrameTimesteps one_chunk;
    one_chunk.chunk_starts = {0};
    const auto chunked = sf::train::flow_matching_noise(x, c, g2, one_chunk);
    EXPECT_TRUE(torch::equal(plain.noisy, chunked.noisy));
    EXPECT_EQ(plain.timesteps.sizes(), (at::IntArrayRef{2}));
    // A one-frame window (an image) is never image-to-video: it would have nothing to predict.
    FrameTimesteps i2v;
    i2v.clean_first_frame = true;
    const at::Tensor image = video_latents(2, 1);
    at::Generator g4 = seeded(7);
    const auto a = sf::train::flow_matching_noise(image, c, g3);
    const auto b = sf::train::flow_matching_noise(image, c, g4, i2v);
    EXPECT_TRUE(torch::equal(a.noisy, b.noisy));
    EXPECT_FALSE(b.frame_weights.defined());
}

TEST(FlowMatchingFrames, ImageToVideoKeepsFrameZeroCleanAndOutOfTheLoss) {
    const sf::train::FlowMatchingConfig c;
    const at::Tensor x0 = video_latents(2, 4);
    at::Generator g = seeded(3);
    FrameTimesteps frames;
    frames.clean_first_frame = true;
    const auto noised = sf::train::flow_matching_noise(x0, c, g, frames);
    EXPECT_TRUE(torch::equal(noised.noisy.select(2, 0), x0.select(2, 0)));
    EXPECT_EQ(noised.timesteps.select(1, 0).abs().max().item<float>(), 0.0f);
    EXPECT_GT(noised.timesteps.select(1, 1).min().item<float>(), 0.0f);

    // The loss gives frame 0 no gradient, and is the plain mean over the other frames.
    const at::Tensor prediction = torch::randn(x0.sizes()).requires_grad_(true);
    const at::Tensor loss =
        sf::train::flow_matching_loss(prediction, noised.target, noised.frame_weights);
    loss.backward();
    EXPECT_EQ(prediction.grad().select(2, 0).abs().max().item<float>(), 0.0f);
    EXPECT_GT(prediction.grad().select(2, 1).abs().max().item<float>(), 0.0f);
    const at::Tensor rest = sf::train::flow_matching_loss(prediction.detach().narrow(2, 1, 3),
                                                          noised.target.narrow(2, 1, 3));
    EXPECT_NEAR(loss.item<double>(), rest.item<double>(), 1e-6);
}

// sigma_sqrt weighs by sigma^-2, infinite on the clean frame 0: that frame is out of the loss and
// its weight 0, so the loss stays finite and frame 0 gets no gradient.
TEST(FlowMatchingFrames, ImageToVideoWithSigmaWeightingStaysFinite) {
    sf::train::FlowMatchingConfig c;
    c.weighting_scheme = "sigma_sqrt";
    const at::Tensor x0 = video_latents(2, 4);
    at::Generator g = seeded(3);
    FrameTimesteps frames;
    frames.clean_first_frame = true;
    const auto noised = sf::train::flow_matching_noise(x0, c, g, frames);
    EXPECT_EQ(noised.loss_weights.select(1, 0).abs().max().item<float>(), 0.0f);
    const at::Tensor prediction = torch::randn(x0.sizes()).requires_grad_(true);
    const at::Tensor loss = sf::train::flow_matching_loss(
        prediction, noised.target, noised.frame_weights, noised.loss_weights);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    loss.backward();
    EXPECT_EQ(prediction.grad().select(2, 0).abs().max().item<float>(), 0.0f);
}

TEST(FlowMatchingFrames, ChunkStartsMustIncreaseFromZero) {
    EXPECT_NO_THROW(sf::train::check_chunk_starts({}));
    EXPECT_NO_THROW(sf::train::check_chunk_starts({0, 3, 6}));
    EXPECT_THROW(sf::train::check_chunk_starts({1, 3}), sf::Error);
    EXPECT_THROW(sf::train::check_chunk_starts({0, 3, 3}), sf::Error);
}

TEST(FrameSplit, OneFrameBucketsAreImages) {
    using sf::train::Bucket;
    const std::map<Bucket, std::vector<int64_t>> buckets = {
        {Bucket{1, 32, 32}, {0, 1}}, {Bucket{5, 32, 48}, {2}}, {Bucket{9, 32, 48}, {3, 4}}};
    const auto split = sf::train::split_by_frames(buckets);
    EXPECT_EQ(split.images.size(), 1u);
    EXPECT_EQ(split.videos.size(), 2u);
}

SanaVideoTransformer tiny_video(uint64_t seed = 3) {
    auto c = SanaVideoTransformerConfig::named("sana-video-tiny");
    c.in_channels = c.out_channels = 8;
    c.caption_channels = 16;
    torch::manual_seed(seed);
    return SanaVideoTransformer(c);
}

// Two windows of 3 latent frames at 8 x 12 latents, with 5- and 3-token captions.
sf::train::MicroBatch video_batch() {
    torch::manual_seed(11);
    sf::train::MicroBatch b;
    b.latents = torch::randn({2, 8, 3, 8, 12});
    b.prompt_embeds = torch::randn({2, 5, 16});
    b.prompt_mask = torch::ones({2, 5}, torch::kLong);
    b.prompt_mask[1].slice(0, 3).fill_(0);
    return b;
}

// The gradients of one step of `o` (learning rate 0: the weights stay as built).
std::vector<std::pair<std::string, at::Tensor>> step_gradients(sf::train::TrainStepOptions o) {
    o.keep_gradients = true;
    auto model = tiny_video();
    auto params = sf::model::trainable_parameters(*model);
    sf::train::AdamWOptions a;
    a.lr = 0;
    sf::train::TrainStep step(model.ptr(), params, a, sf::train::LRSchedule("constant", 0, 0, 10),
                              o, c10::Device(c10::kCPU));
    const sf::train::MicroBatch batch = video_batch();
    at::Generator g = seeded(1);
    if (o.accumulation == 1) {
        step.step([&](int64_t) { return batch; }, g);
    } else {
        step.step(
            [&](int64_t k) {
                return sf::train::MicroBatch{batch.latents.slice(0, k, k + 1),
                                             batch.prompt_embeds.slice(0, k, k + 1),
                                             batch.prompt_mask.slice(0, k, k + 1)};
            },
            g);
    }
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [name, p] : params) out.emplace_back(name, p.grad().clone());
    return out;
}

TEST(TrainStepVideo, EveryRemedyGivesThePlainGradients) {
    sf::train::TrainStepOptions plain;
    plain.chunk_starts = {0, 2};
    const auto reference = step_gradients(plain);
    std::vector<std::pair<std::string, sf::train::TrainStepOptions>> remedies;
    auto o = plain;
    o.gradient_checkpointing = 1;
    remedies.emplace_back("checkpointing", o);
    o = plain;
    o.attention = "chunked";
    o.attention_chunk = 7;
    remedies.emplace_back("chunked attention", o);
    o = plain;
    o.accumulation = 2;
    remedies.emplace_back("accumulation", o);
    o = plain;
    o.ff_chunk_size = 1;
    remedies.emplace_back("chunked feed-forward", o);
    o = plain;
    o.mixed_precision = "no";
    o.gradient_checkpointing = 1;
    o.attention = "chunked";
    o.attention_chunk = 5;
    o.ff_chunk_size = 2;
    o.accumulation = 2;
    remedies.emplace_back("all but precision and the fused pass", o);
    for (const auto& [what, options] : remedies) {
        const auto grads = step_gradients(options);
        ASSERT_EQ(grads.size(), reference.size());
        for (size_t i = 0; i < grads.size(); ++i) {
            EXPECT_TRUE(torch::allclose(grads[i].second, reference[i].second, 1e-4, 1e-6))
                << what << ": " << grads[i].first;
        }
    }
}

// Every remedy that recomputes a piece of a block apart: block checkpointing, query chunks of 7
// tokens, the feed-forward one frame at a time (the fused pass refuses clipping).
sf::train::TrainStepOptions recomputing_options() {
    sf::train::TrainStepOptions o;
    o.gradient_checkpointing = 1;
    o.attention = "chunked";
    o.attention_chunk = 7;
    o.ff_chunk_size = 1;
    o.max_grad_norm = 0;
    return o;
}

// `steps` steps of `o` on `model` at learning rate `lr`, `sync` counting what it is told.
void train_video(SanaVideoTransformer& model, const sf::train::TrainStepOptions& o, double lr,
                 int steps, std::shared_ptr<sf::train::GradientSync> sync = nullptr) {
    sf::train::AdamWOptions a;
    a.lr = lr;
    sf::train::TrainStep step(model.ptr(), sf::model::trainable_parameters(*model), a,
                              sf::train::LRSchedule("constant", lr, 0, 10), o,
                              c10::Device(c10::kCPU), std::move(sync));
    const sf::train::MicroBatch batch = video_batch();
    at::Generator g = seeded(1);
    for (int i = 0; i < steps; ++i) step.step([&](int64_t) { return batch; }, g);
}

// Each gradient is complete once per backward pass (the fused pass and the data-parallel sync
// act then) also when frames of the feed-forward and chunks of queries are recomputed apart.
TEST(TrainStepVideo, EachGradientIsCompleteOnceInABackwardPassWithEveryRemedy) {
    sf::train::TrainStepOptions o = recomputing_options();
    o.keep_gradients = true;
    for (bool checkpointing : {false, true}) {
        o.gradient_checkpointing = checkpointing ? 1 : 0;
        auto model = tiny_video();
        auto sync = std::make_shared<sf::test::CountingSync>();
        train_video(model, o, 1e-3, 1, sync);
        const auto params = sf::model::trainable_parameters(*model);
        ASSERT_EQ(sync->counts.size(), params.size());
        for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_EQ(sync->counts[i], params[i].second.grad().defined() ? 1 : 0)
                << "checkpointing " << checkpointing << ": " << params[i].first;
        }
    }
}

// The fused backward pass on the video transformer, with every recomputing remedy: three steps
// end with the weights of the plain optimizer step under the same remedies.
TEST(TrainStepVideo, FusedBackwardPassUpdatesLikeTheOptimizerStep) {
    const sf::train::TrainStepOptions plain = recomputing_options();
    sf::train::TrainStepOptions fused = plain;
    fused.fused_backward = true;
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> weights;
    for (const auto& o : {plain, fused}) {
        auto model = tiny_video();
        train_video(model, o, 1e-3, 3);
        weights.push_back(sf::model::trainable_parameters(*model));
    }
    ASSERT_EQ(weights[0].size(), weights[1].size());
    for (size_t i = 0; i < weights[0].size(); ++i) {
        EXPECT_TRUE(torch::equal(weights[0][i].second, weights[1][i].second))
            << weights[0][i].first;
    }
}

// LoRA on the video transformer: three steps with every recomputing remedy and the fused pass
// move the adapters and leave every base weight bit for bit as it was.
TEST(TrainStepVideo, LoRATrainsTheAdaptersAndLeavesTheBaseBitIdentical) {
    auto model = tiny_video();
    std::map<std::string, at::Tensor> base;
    for (const auto& item : model->named_parameters()) base[item.key()] = item.value().clone();
    sf::model::LoRAConfig lora;
    lora.targets = {"to_q", "to_k", "to_v", "to_out.0"};
    ASSERT_GT(sf::model::add_lora(*model, lora), 0);
    sf::train::TrainStepOptions o = recomputing_options();
    o.fused_backward = true;
    train_video(model, o, 1e-2, 3);
    int64_t adapters = 0;
    for (const auto& item : model->named_parameters()) {
        auto it = base.find(item.key());
        if (it == base.end()) {
            ++adapters;
            if (item.key().find("lora_B") != std::string::npos) {
                EXPECT_GT(item.value().abs().max().item<double>(), 0) << item.key();
            }
            continue;
        }
        EXPECT_FALSE(item.value().requires_grad()) << item.key();
        EXPECT_TRUE(torch::equal(item.value(), it->second)) << item.key();
    }
    EXPECT_EQ(adapters, 2 * 2 * 4 * 2);  // A and B, 4 targets, 2 attentions, 2 blocks
}

// bf16 autocast: q and k leave their fp32 RMSNorm in fp32, v is bf16; every attention kernel
// computes in bf16 as upstream's SDPA does, and chunking changes nothing but rounding.
TEST(TrainStepVideo, MixedPrecisionWorksWithEveryAttentionKernel) {
    sf::train::TrainStepOptions dense;
    dense.mixed_precision = "bf16";
    const auto reference = step_gradients(dense);
    auto chunked = dense;
    chunked.attention = "chunked";
    chunked.attention_chunk = 7;
    chunked.ff_chunk_size = 1;
    const auto grads = step_gradients(chunked);
    for (size_t i = 0; i < grads.size(); ++i) {
        ASSERT_TRUE(torch::isfinite(grads[i].second).all().item<bool>()) << grads[i].first;
        EXPECT_TRUE(torch::allclose(grads[i].second, reference[i].second, 5e-2, 1e-3))
            << grads[i].first;
    }
}

TEST(TrainStepVideo, ImageToVideoStepsTrainAndAreRefusedOutOfRange) {
    sf::train::TrainStepOptions o;
    o.i2v_probability = 1.0;
    const auto grads = step_gradients(o);
    const auto plain = step_gradients(sf::train::TrainStepOptions{});
    double total = 0, differs = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
        total += grads[i].second.abs().sum().item<double>();
        differs += (grads[i].second - plain[i].second).abs().sum().item<double>();
    }
    EXPECT_GT(total, 0.0);
    EXPECT_TRUE(std::isfinite(total));
    EXPECT_GT(differs, 1e-3 * total) << "image-to-video changed nothing in the step";
    o.i2v_probability = 1.5;
    EXPECT_THROW(step_gradients(o), sf::Error);
    o.i2v_probability = 0;
    o.chunk_starts = {2, 1};
    EXPECT_THROW(step_gradients(o), sf::Error);
}

}  // namespace
