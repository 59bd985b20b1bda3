// SanaVideoTransformer against diffusers itself: the golden tiny SANA-Video model of
// tests/data/golden-video loads by name and reproduces upstream's forward pass, the per-token
// timestep (image-to-video) forward, the loss and the gradient of every parameter of a training
// step; plus the per-frame timestep, the caption mask, gradient checkpointing, the guidance
// embedder, the chunked self-attention kernel, the config file, bad inputs and the analytic
// parameter counts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/autocast.h"
#include "model/common/linear_attention.h"
#include "model/common/weights.h"
#include "model/sana_video/sana_video_blocks.h"
#include "model/sana_video/sana_video_config.h"
#include "model/sana_video/sana_video_transformer.h"
#include "model_golden_util.h"
#include "model_module_run.h"
#include "test_util.h"

namespace {

using sf::model::SanaVideoTransformer;
using sf::model::SanaVideoTransformerConfig;
using sf::test::expect_close;
using sf::test::load_ref;

// The golden README's fp32 tolerances.
using sf::test::kForwardAtol;
using sf::test::kForwardRtol;
using sf::test::kGradAtol;
using sf::test::kGradRtol;

std::string model_dir() { return sf::test::golden_video_path("transformer_video"); }
using sf::test::video_ref_path;

SanaVideoTransformer load_golden() {
    SanaVideoTransformer model(SanaVideoTransformerConfig::from_json_file(model_dir()));
    sf::model::load_weights(*model, model_dir());
    model->eval();
    return model;
}

void expect_invalid_naming(const std::function<void()>& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no error (wanted one naming '" << needle << "')";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(SanaVideoGolden, ForwardMatchesUpstream) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    SanaVideoTransformer model = load_golden();
    auto r = load_ref(video_ref_path("transformer_video_forward.safetensors"));
    torch::NoGradGuard no_grad;
    const at::Tensor sample = model(r.at("hidden_states"), r.at("encoder_hidden_states"),
                                    r.at("timestep"), r.at("encoder_attention_mask"));
    expect_close(sample, r.at("sample"), kForwardRtol, kForwardAtol, "sample");
}

TEST(SanaVideoGolden, PerTokenTimestepForwardMatchesUpstream) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    SanaVideoTransformer model = load_golden();
    auto r = load_ref(video_ref_path("transformer_video_forward_i2v.safetensors"));
    const at::Tensor& t = r.at("timestep");  // [B, 1, f, h, w]
    ASSERT_EQ(t.dim(), 5);
    torch::NoGradGuard no_grad;
    const at::Tensor sample = model(r.at("hidden_states"), r.at("encoder_hidden_states"), t,
                                    r.at("encoder_attention_mask"));
    expect_close(sample, r.at("sample"), kForwardRtol, kForwardAtol, "per-token sample");

    // The same timesteps given per latent frame ([B, f]: constant over each frame's patches, as
    // image-to-video makes them) are the same model call.
    const at::Tensor per_frame = t.select(1, 0).select(3, 0).select(2, 0);  // [B, f]
    ASSERT_TRUE(torch::equal(per_frame.view({t.size(0), 1, -1, 1, 1}).expand_as(t), t));
    const at::Tensor framed = model(r.at("hidden_states"), r.at("encoder_hidden_states"), per_frame,
                                    r.at("encoder_attention_mask"));
    expect_close(framed, r.at("sample"), kForwardRtol, kForwardAtol, "per-frame sample");
    // And frame 0's clean timestep matters: a per-sample timestep gives another output.
    const at::Tensor per_sample = model(r.at("hidden_states"), r.at("encoder_hidden_states"),
                                        per_frame.select(1, 1), r.at("encoder_attention_mask"));
    EXPECT_FALSE(torch::allclose(per_sample, framed, 1e-3, 1e-3));
}

// One training step of the golden model, set up by `setup`, against upstream's loss and every
// gradient.
void expect_upstream_training_step(const std::function<void(SanaVideoTransformer&)>& setup) {
    SanaVideoTransformer model = load_golden();
    model->train();
    setup(model);
    auto r = load_ref(video_ref_path("transformer_video_train_step.safetensors"));
    const at::Tensor sigma = r.at("sigma").view({-1, 1, 1, 1, 1});
    const at::Tensor x_t = (1 - sigma) * r.at("x0") + sigma * r.at("noise");
    const at::Tensor target = r.at("noise") - r.at("x0");
    expect_close(x_t, r.at("hidden_states"), 1e-6, 1e-7, "x_t");
    expect_close(target, r.at("target"), 1e-6, 1e-7, "target");

    const at::Tensor sample =
        model(x_t, r.at("encoder_hidden_states"), r.at("timestep"), r.at("encoder_attention_mask"));
    const at::Tensor loss = torch::mse_loss(sample, target);
    loss.backward();
    expect_close(sample, r.at("sample"), kForwardRtol, kForwardAtol, "train sample");
    expect_close(loss, r.at("loss"), kForwardRtol, 0.0, "loss");

    std::set<std::string> seen;
    double worst = 0;
    for (const auto& p : model->named_parameters()) {
        const std::string key = "grad." + p.key();
        ASSERT_TRUE(r.count(key)) << "no upstream gradient for " << p.key();
        ASSERT_TRUE(p.value().grad().defined()) << "no gradient for " << p.key();
        const auto stats = expect_close(p.value().grad(), r.at(key), kGradRtol, kGradAtol, key);
        worst = std::max(worst, stats.ok ? stats.worst_ratio : 1e9);
        seen.insert(key);
    }
    size_t upstream = 0;
    for (const auto& [name, tensor] : r) upstream += name.rfind("grad.", 0) == 0;
    EXPECT_EQ(seen.size(), upstream);
    std::printf("[ golden   ] %zu gradients, worst error / tolerance %.3f\n", seen.size(), worst);
}

TEST(SanaVideoGolden, TrainingStepLossAndEveryGradientMatchUpstream) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    expect_upstream_training_step([](SanaVideoTransformer&) {});
}

// The chunked kernels (self-attention over 7 tokens at a time, the last chunk shorter, and the
// cross-attention's) reproduce upstream's plain ops as closely.
TEST(SanaVideoGolden, ChunkedAttentionTrainingStepMatchesUpstream) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    expect_upstream_training_step([](SanaVideoTransformer& model) {
        model->set_attention(sf::model::AttentionKernel::kChunked, 7);
        for (const auto& block : model->blocks()) {
            const auto* attn =
                dynamic_cast<const sf::model::SanaVideoTransformerBlockImpl*>(block.get());
            ASSERT_NE(attn, nullptr);
            EXPECT_EQ(attn->attn1->chunk_tokens, 7);
        }
    });
}

TEST(SanaVideoGolden, PaddedCaptionTokensDoNotReachTheOutput) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    SanaVideoTransformer model = load_golden();
    auto r = load_ref(video_ref_path("transformer_video_forward.safetensors"));
    const at::Tensor mask = r.at("encoder_attention_mask");
    ASSERT_LT(mask.sum().item<int64_t>(), mask.numel()) << "the golden mask pads nothing";
    torch::NoGradGuard no_grad;
    const at::Tensor caption = r.at("encoder_hidden_states");
    const at::Tensor changed = caption + (mask == 0).unsqueeze(-1) * 100.0;
    const at::Tensor a = model(r.at("hidden_states"), caption, r.at("timestep"), mask);
    const at::Tensor b = model(r.at("hidden_states"), changed, r.at("timestep"), mask);
    expect_close(b, a, 1e-6, 1e-6, "output with changed padding");
    const at::Tensor unmasked = model(r.at("hidden_states"), changed, r.at("timestep"));
    EXPECT_FALSE(torch::allclose(unmasked, a, 1e-3, 1e-3)) << "without a mask padding must count";
}

TEST(SanaVideoTransformer, GradientCheckpointingGivesTheSameGradients) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    auto r = load_ref(video_ref_path("transformer_video_train_step.safetensors"));
    auto grads_with = [&](int64_t every) {
        SanaVideoTransformer model = load_golden();
        model->train();
        model->set_gradient_checkpointing(every);
        const at::Tensor out = model(r.at("hidden_states"), r.at("encoder_hidden_states"),
                                     r.at("timestep"), r.at("encoder_attention_mask"));
        torch::mse_loss(out, r.at("target")).backward();
        std::map<std::string, at::Tensor> g;
        for (const auto& p : model->named_parameters()) g[p.key()] = p.value().grad().clone();
        return g;
    };
    const auto plain = grads_with(0), checkpointed = grads_with(1);
    for (const auto& [name, grad] : plain) {
        expect_close(checkpointed.at(name), grad, 1e-5, 1e-7, "checkpointed grad." + name);
    }
    expect_invalid_naming([] { load_golden()->set_gradient_checkpointing(-1); }, "checkpointing");
}

// Forward and backward of one window; returns the input's gradient and the peak counted bytes.
std::pair<at::Tensor, int64_t> window_step(SanaVideoTransformer& model, const at::Tensor& x,
                                           const at::Tensor& caption) {
    const at::Tensor input = x.clone().requires_grad_(true);
    sf::mem::reset_peak();
    const int64_t before = sf::mem::cpu_stats().current;
    model(input, caption, torch::full({x.size(0)}, 400.0)).pow(2).mean().backward();
    return {input.grad(), sf::mem::cpu_stats().peak - before};
}

TEST(SanaVideoTransformer, ChunkedFeedForwardGivesTheSameGradientsWithLessMemory) {
    auto config = SanaVideoTransformerConfig::named("sana-video-tiny");
    config.in_channels = config.out_channels = 8;
    config.caption_channels = 16;
    torch::manual_seed(4);
    SanaVideoTransformer model(config);
    torch::manual_seed(5);
    const at::Tensor x = torch::randn({1, 8, 8, 16, 16});  // 8 latent frames of 8 x 8 patches
    const at::Tensor caption = torch::randn({1, 6, 16});
    const auto [plain_grad, plain_peak] = window_step(model, x, caption);
    std::map<std::string, at::Tensor> plain_params;
    for (const auto& p : model->named_parameters()) {
        plain_params[p.key()] = p.value().grad().clone();
        p.value().mutable_grad() = at::Tensor();
    }
    for (const int64_t every : {0, 1}) {  // alone, and inside a checkpointed block
        model->set_feed_forward_chunk(2);
        model->set_gradient_checkpointing(every);
        const auto [grad, peak] = window_step(model, x, caption);
        expect_close(grad, plain_grad, 1e-4, 1e-7,
                     "input gradient, checkpointing " + std::to_string(every));
        for (const auto& p : model->named_parameters()) {
            expect_close(p.value().grad(), plain_params.at(p.key()), 1e-4, 1e-7, "grad." + p.key());
            p.value().mutable_grad() = at::Tensor();
        }
        if (every == 0) {
            std::printf("[ memory   ] peak %lld bytes plain, %lld with 2-frame chunks\n",
                        static_cast<long long>(plain_peak), static_cast<long long>(peak));
            EXPECT_LT(peak, plain_peak * 8 / 10) << "the 6D-wide hidden is kept for every frame";
        }
    }
    model->set_gradient_checkpointing(0);
    expect_invalid_naming([&] { model->set_feed_forward_chunk(-1); }, "feed-forward chunk");
}

// The rotary linear self-attention over token chunks (rotary_relu_linear_attention): the plain
// ops' output and gradients in fp32, a lower peak, and under bf16 autocast no further from the
// fp32 run than the plain ops (whose normaliser is bf16 there).
TEST(SanaVideoLinearAttention, TokenChunksEqualThePlainOpsWithALowerPeak) {
    torch::manual_seed(21);
    sf::model::SanaVideoLinearAttention attn(64, 4, 16, /*bias=*/false, /*qk_norm=*/true, 0.0);
    const sf::model::VideoGrid grid{4, 32, 32};  // 4096 tokens
    const auto [cos, sin] = sf::model::sana_video_rotary(16, grid, at::kCPU);
    const at::Tensor x0 = torch::randn({2, grid.tokens(), 64}), g = torch::randn_like(x0);
    using Run = sf::test::ModuleRun;
    auto run = [&](int64_t chunk, bool bf16) {
        attn->chunk_tokens = chunk;
        return sf::test::run_module(
            *attn, [&](const at::Tensor& x) { return attn(x, cos, sin); }, x0, g, bf16);
    };
    const Run whole = run(0, false);
    for (const int64_t chunk : {1000, 512, 4096}) {  // 1000 leaves a short last chunk
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const Run chunked = run(chunk, false);
        expect_close(chunked.out, whole.out, 1e-5, 1e-5, "out");
        expect_close(chunked.grad_x, whole.grad_x, 1e-4, 1e-5, "grad x");
        for (const auto& [name, grad] : whole.grads)
            expect_close(chunked.grads.at(name), grad, 1e-4, 1e-5, "grad." + name);
        if (chunk == 512) {
            std::printf(
                "[ memory   ] rotary linear attention N 4096, fp32: whole %.1f MB, 512-token "
                "chunks %.1f MB\n",
                whole.peak / 1e6, chunked.peak / 1e6);
            // The kernel keeps q, k, v and the sums; the plain ops also the ReLUs, rotations and
            // products (measured 0.78 of the whole run's peak, which also holds the projections
            // and norms both keep).
            EXPECT_LT(chunked.peak, whole.peak * 85 / 100);
        }
    }
    const auto rel = sf::test::relative_error;
    const Run whole_bf16 = run(0, true), chunked_bf16 = run(1000, true);
    std::printf(
        "[ memory   ] rotary linear attention N 4096, bf16: whole %.1f MB, 1000-token chunks "
        "%.1f MB\n",
        whole_bf16.peak / 1e6, chunked_bf16.peak / 1e6);
    EXPECT_LT(chunked_bf16.peak, whole_bf16.peak);
    EXPECT_LT(rel(chunked_bf16.out, whole.out), 1.5 * rel(whole_bf16.out, whole.out) + 1e-3);
    EXPECT_LT(rel(chunked_bf16.grad_x, whole.grad_x),
              1.5 * rel(whole_bf16.grad_x, whole.grad_x) + 1e-3);
    attn->chunk_tokens = 0;
}

TEST(SanaVideoLinearAttention, TheKernelRefusesBadArgumentsNamingThem) {
    using sf::model::rotary_relu_linear_attention;
    const at::Tensor x = torch::randn({2, 6, 8}), table = torch::randn({6, 2});
    expect_invalid_naming([&] { rotary_relu_linear_attention(x, x, x, table, table, 2, 0); },
                          "chunk");
    expect_invalid_naming([&] { rotary_relu_linear_attention(x, x, x, table, table, 3, 4); },
                          "do not divide");
    expect_invalid_naming([&] { rotary_relu_linear_attention(x, x, x, table, table, 8, 4); },
                          "even");
    expect_invalid_naming(
        [&] { rotary_relu_linear_attention(x, x.narrow(1, 0, 5), x, table, table, 2, 4); },
        "alike");
    expect_invalid_naming(
        [&] { rotary_relu_linear_attention(x, x, x, table.narrow(0, 0, 5), table, 2, 4); },
        "cos and sin");
    expect_invalid_naming(
        [&] { rotary_relu_linear_attention(x, x, x, table, table.to(at::kDouble), 2, 4); },
        "cos and sin");
    expect_invalid_naming(
        [&] { rotary_relu_linear_attention(x, x, x.to(at::kLong), table, table, 2, 4); },
        "floating");
}

TEST(SanaVideoTransformer, RefusesBadInputsNamingThem) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    SanaVideoTransformer model = load_golden();
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({2, 8, 3, 8, 10});
    const at::Tensor caption = torch::randn({2, 7, 24});
    const at::Tensor t = torch::full({2}, 500.0);
    expect_invalid_naming([&] { model(torch::randn({2, 8, 8, 10}), caption, t); }, "hidden_states");
    expect_invalid_naming([&] { model(torch::randn({2, 8, 3, 7, 10}), caption, t); }, "patch_size");
    expect_invalid_naming([&] { model(x, torch::randn({2, 7, 23}), t); }, "encoder_hidden_states");
    expect_invalid_naming([&] { model(x, caption, torch::full({3}, 1.0)); }, "timestep");
    expect_invalid_naming([&] { model(x, caption, torch::full({2, 4}, 1.0)); }, "per latent frame");
    expect_invalid_naming(
        [&] {
            model(x, caption, t, torch::ones({2, 6}));
        },
        "encoder_attention_mask");
    expect_invalid_naming([&] { model->forward_guided(x, caption, t, {}, torch::full({2}, 4.0)); },
                          "guidance_embeds");
}

TEST(SanaVideoTransformer, GuidanceEmbedderHasUpstreamKeysAndChangesTheOutput) {
    auto config = SanaVideoTransformerConfig::named("sana-video-tiny");
    config.guidance_embeds = true;
    torch::manual_seed(3);
    SanaVideoTransformer model(config);
    std::set<std::string> keys;
    for (const auto& p : model->named_parameters()) keys.insert(p.key());
    EXPECT_TRUE(keys.count("time_embed.guidance_embedder.linear_1.weight"));
    EXPECT_TRUE(keys.count("time_embed.timestep_embedder.linear_2.bias"));
    EXPECT_FALSE(keys.count("time_embed.emb.timestep_embedder.linear_1.weight"));
    EXPECT_EQ(sf::model::parameter_count(*model), sf::model::sana_video_parameter_count(config));

    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({1, 16, 2, 4, 4});
    const at::Tensor caption = torch::randn({1, 5, 2304});
    const at::Tensor t = torch::full({1}, 300.0);
    const at::Tensor a = model->forward_guided(x, caption, t, {}, torch::full({1}, 1.0));
    const at::Tensor b = model->forward_guided(x, caption, t, {}, torch::full({1}, 8.0));
    EXPECT_FALSE(torch::allclose(a, b, 1e-4, 1e-4));
    expect_invalid_naming([&] { model(x, caption, t); }, "guidance");
}

TEST(SanaVideoConfig, ReadsTheGoldenConfigAndRoundTrips) {
    SF_REQUIRE_GOLDEN_VIDEO("transformer_video");
    const auto c = SanaVideoTransformerConfig::from_json_file(model_dir());
    EXPECT_EQ(c.in_channels, 8);
    EXPECT_EQ(c.patch_size, (std::array<int64_t, 3>{1, 2, 2}));
    EXPECT_EQ(c.qk_norm.value_or(""), "rms_norm_across_heads");
    EXPECT_EQ(c.inner_dim(), 64);
    const auto again = SanaVideoTransformerConfig::from_json(c.to_json(), "round trip");
    EXPECT_EQ(again.to_json(), c.to_json());
}

TEST(SanaVideoConfig, RefusesBadFieldsNamingThem) {
    expect_invalid_naming(
        [] { SanaVideoTransformerConfig::from_json(R"({"patch_size": [1, 2]})", "c"); },
        "patch_size");
    expect_invalid_naming(
        [] { SanaVideoTransformerConfig::from_json(R"({"patch_size": 2})", "c"); }, "patch_size");
    expect_invalid_naming(
        [] { SanaVideoTransformerConfig::from_json(R"({"qk_norm": "layer_norm"})", "c"); },
        "qk_norm");
    expect_invalid_naming(
        [] { SanaVideoTransformerConfig::from_json(R"({"cross_attention_dim": 64})", "c"); },
        "cross_attention_dim");
    expect_invalid_naming(
        [] {
            SanaVideoTransformerConfig::from_json(R"({"_class_name": "SanaTransformer2DModel"})",
                                                  "c");
        },
        "SanaTransformer2DModel");
    expect_invalid_naming([] { SanaVideoTransformerConfig::named("sana-video-9b"); },
                          "sana-video-tiny");
}

TEST(SanaVideoConfig, ParameterCountEqualsTheModuleForEveryVariant) {
    auto tiny = SanaVideoTransformerConfig::named("sana-video-tiny");
    std::vector<SanaVideoTransformerConfig> variants{tiny};
    auto v = tiny;
    v.qk_norm.reset();
    variants.push_back(v);
    v = tiny;
    v.norm_elementwise_affine = true;
    v.attention_bias = true;
    v.patch_size = {2, 1, 1};
    variants.push_back(v);
    for (const auto& c : variants) {
        EXPECT_EQ(sf::model::sana_video_parameter_count(c),
                  sf::model::parameter_count(*SanaVideoTransformer(c)))
            << c.to_json();
    }
    if (std::filesystem::exists(model_dir())) {
        const auto golden = SanaVideoTransformerConfig::from_json_file(model_dir());
        EXPECT_EQ(sf::model::sana_video_parameter_count(golden),
                  sf::model::parameter_count(*SanaVideoTransformer(golden)));
    }
    // The full-size models from the numbers alone (building them takes 8 GB): about 2 billion.
    for (const char* name : {"sana-video-2b-480p", "sana-video-2b-720p"}) {
        const int64_t n =
            sf::model::sana_video_parameter_count(SanaVideoTransformerConfig::named(name));
        std::printf("[ params   ] %s: %lld\n", name, static_cast<long long>(n));
        EXPECT_GT(n, 1'800'000'000) << name;
        EXPECT_LT(n, 2'300'000'000) << name;
    }
}

}  // namespace
