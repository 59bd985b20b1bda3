// SanaTransformer against diffusers itself: the golden tiny models of tests/data/golden load by
// name and reproduce upstream's forward pass, the gradient of every parameter in a training step
// and an AdamW step; plus the config file, checkpoint refusal, determinism and parameter counts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/autocast.h"
#include "model/common/weights.h"
#include "model/sana/sana_config.h"
#include "model/sana/sana_transformer.h"
#include "model_golden_util.h"
#include "test_util.h"

namespace {

using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;
using sf::test::expect_close;
using sf::test::golden_path;
using sf::test::load_ref;

// fp32 tolerances: forward outputs as the golden README suggests; gradients are deep sums whose
// order of summation differs from upstream's, so they get a looser relative bound.
using sf::test::kForwardAtol;
using sf::test::kForwardRtol;
using sf::test::kGradAtol;
using sf::test::kGradRtol;

SanaTransformer load_golden(const std::string& dir) {
    const auto config = SanaTransformerConfig::from_json_file(golden_path(dir));
    SanaTransformer model(config);
    sf::model::load_weights(*model, golden_path(dir));
    model->eval();
    return model;
}

// Runs a golden forward file through the model and compares the sample.
void expect_forward_matches(const std::string& dir, const std::string& ref_file) {
    SanaTransformer model = load_golden(dir);
    auto ref = load_ref(ref_file);
    torch::NoGradGuard no_grad;
    const at::Tensor sample = model(ref.at("hidden_states"), ref.at("encoder_hidden_states"),
                                    ref.at("timestep"), ref.at("encoder_attention_mask"));
    expect_close(sample, ref.at("sample"), kForwardRtol, kForwardAtol, dir + " sample");
}

TEST(SanaGolden, ForwardMatchesUpstream) {
    expect_forward_matches("transformer", "transformer_forward.safetensors");
}

TEST(SanaGolden, ForwardWithSinCosPositionEmbeddingMatchesUpstream) {
    // Patch size 2 on a 12 x 20 latent: a 6 x 10 grid, not the 4 x 4 base grid of sample_size 8,
    // so the embedding is the interpolated one.
    expect_forward_matches("transformer_pe", "transformer_pe_forward.safetensors");
}

TEST(SanaGolden, TrainingStepLossAndEveryGradientMatchUpstream) {
    SanaTransformer model = load_golden("transformer");
    model->train();
    auto ref = load_ref("transformer_train_step.safetensors");
    const at::Tensor& x0 = ref.at("x0");
    const at::Tensor& noise = ref.at("noise");
    const at::Tensor sigma = ref.at("sigma").view({-1, 1, 1, 1});  // [B] -> [B, 1, 1, 1]
    // The flow-matching step as the manifest describes it, checked against the stored inputs.
    const at::Tensor x_t = (1 - sigma) * x0 + sigma * noise;
    const at::Tensor target = noise - x0;
    expect_close(x_t, ref.at("hidden_states"), 1e-6, 1e-7, "x_t");
    expect_close(target, ref.at("target"), 1e-6, 1e-7, "target");
    expect_close(ref.at("sigma") * 1000, ref.at("timestep"), 1e-6, 1e-7, "timestep");

    const at::Tensor sample = model(x_t, ref.at("encoder_hidden_states"), ref.at("timestep"),
                                    ref.at("encoder_attention_mask"));
    const at::Tensor loss = torch::mse_loss(sample, target);
    loss.backward();
    expect_close(sample, ref.at("sample"), kForwardRtol, kForwardAtol, "train sample");
    expect_close(loss, ref.at("loss"), kForwardRtol, 0.0, "loss");

    double worst_abs = 0, worst_rel = 0;
    std::set<std::string> seen;
    for (const auto& p : model->named_parameters()) {
        const std::string key = "grad." + p.key();
        ASSERT_TRUE(ref.count(key)) << "no upstream gradient for " << p.key();
        ASSERT_TRUE(p.value().grad().defined()) << "no gradient for " << p.key();
        const auto stats = expect_close(p.value().grad(), ref.at(key), kGradRtol, kGradAtol, key);
        worst_abs = std::max(worst_abs, stats.max_abs);
        worst_rel = std::max(worst_rel, stats.ok ? stats.worst_ratio : 1e9);
        seen.insert(key);
    }
    size_t upstream = 0;
    for (const auto& [name, tensor] : ref) {
        if (name.rfind("grad.", 0) != 0) continue;
        ++upstream;
        EXPECT_TRUE(seen.count(name)) << name << " has no parameter in the model";
    }
    EXPECT_EQ(seen.size(), upstream);
    std::printf("[ golden   ] %zu gradients: max abs error %.3e, worst error / tolerance %.3f\n",
                seen.size(), worst_abs, worst_rel);
}

TEST(SanaGolden, AdamWStepMatchesUpstream) {
    SanaTransformer model = load_golden("transformer");
    auto grads = load_ref("transformer_train_step.safetensors");
    auto ref = load_ref("transformer_adamw_step.safetensors");
    // Upstream's gradients, not ours: a few are rounding noise around zero (attn2.to_k.bias, which
    // the softmax cannot see), and AdamW turns any such noise into a full-size step.
    std::vector<at::Tensor> params;
    for (const auto& p : model->named_parameters()) {
        ASSERT_TRUE(torch::equal(p.value(), ref.at("before." + p.key()))) << p.key();
        p.value().mutable_grad() = grads.at("grad." + p.key()).clone();
        params.push_back(p.value());
    }
    torch::optim::AdamW adamw(
        params, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
    adamw.step();
    for (const auto& p : model->named_parameters()) {
        expect_close(p.value(), ref.at("after." + p.key()), 1e-6, 1e-7, "after." + p.key());
    }
}

TEST(SanaGolden, PaddedCaptionTokensDoNotReachTheOutput) {
    SanaTransformer model = load_golden("transformer");
    auto ref = load_ref("transformer_forward.safetensors");
    const at::Tensor mask = ref.at("encoder_attention_mask");
    ASSERT_LT(mask.sum().item<int64_t>(), mask.numel()) << "the golden mask pads nothing";
    torch::NoGradGuard no_grad;
    const at::Tensor caption = ref.at("encoder_hidden_states");
    const at::Tensor padding = (mask == 0).unsqueeze(-1);  // [B, L, 1]
    const at::Tensor changed = caption + padding * 100.0;  // padded tokens only
    const at::Tensor a = model(ref.at("hidden_states"), caption, ref.at("timestep"), mask);
    const at::Tensor b = model(ref.at("hidden_states"), changed, ref.at("timestep"), mask);
    expect_close(b, a, 1e-6, 1e-6, "output with changed padding");
    const at::Tensor unmasked = model(ref.at("hidden_states"), changed, ref.at("timestep"));
    EXPECT_FALSE(torch::allclose(unmasked, a, 1e-3, 1e-3)) << "without a mask padding must count";
}

TEST(SanaGolden, RefusesCheckpointOfAnotherShapeNamingEveryTensor) {
    const std::string weights = golden_path("transformer");
    // Patch size 2: the patch conv and proj_out change shape.
    SanaTransformer other(SanaTransformerConfig::from_json_file(golden_path("transformer_pe")));
    try {
        sf::model::load_weights(*other, weights);
        FAIL() << "a checkpoint of another patch size must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        EXPECT_NE(msg.find("3 misshaped"), std::string::npos) << msg;
        EXPECT_NE(msg.find("patch_embed.proj.weight: checkpoint has [64, 8, 1, 1], model wants "
                           "[64, 8, 2, 2]"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("proj_out.weight"), std::string::npos) << msg;
        EXPECT_NE(msg.find("proj_out.bias"), std::string::npos) << msg;
        EXPECT_NE(msg.find(weights), std::string::npos) << msg;
    }
    // One block more: the 19 tensors of block 2 are missing; one block fewer: unexpected.
    auto config = SanaTransformerConfig::from_json_file(weights);
    config.num_layers = 3;
    SanaTransformer deeper(config);
    try {
        sf::model::load_weights(*deeper, weights);
        FAIL() << "a checkpoint with fewer blocks must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("19 missing"), std::string::npos) << msg;
        EXPECT_NE(msg.find("transformer_blocks.2.attn2.to_out.0.bias [64]"), std::string::npos)
            << msg;
    }
    config.num_layers = 1;
    SanaTransformer shallower(config);
    try {
        sf::model::load_weights(*shallower, weights);
        FAIL() << "a checkpoint with more blocks must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("19 unexpected"), std::string::npos) << msg;
        EXPECT_NE(msg.find("transformer_blocks.1.ff.conv_point.weight"), std::string::npos) << msg;
    }
}

TEST(SanaGolden, SaveThenLoadGivesTheSameModel) {
    sf::test::TempDir tmp("sf_sana");
    SanaTransformer model = load_golden("transformer");
    sf::model::save_weights(*model, tmp.file("diffusion_pytorch_model.safetensors"));
    SanaTransformer copy(model->config());
    sf::model::load_weights(*copy, tmp.path().string());
    for (const auto& [name, tensor] : sf::model::state_dict(*model)) {
        EXPECT_TRUE(torch::equal(tensor, copy->named_parameters()[name])) << name;
    }
}

TEST(SanaTransformer, SameInputGivesIdenticalOutputBytes) {
    SanaTransformer model = load_golden("transformer_pe");
    auto ref = load_ref("transformer_pe_forward.safetensors");
    torch::NoGradGuard no_grad;
    auto run = [&] {
        return model(ref.at("hidden_states"), ref.at("encoder_hidden_states"), ref.at("timestep"),
                     ref.at("encoder_attention_mask"))
            .contiguous();
    };
    const at::Tensor a = run(), b = run();
    ASSERT_EQ(a.sizes(), b.sizes());
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
}

TEST(SanaTransformer, TinyConfigTrainsOnRealWidthInputs) {
    // sana-tiny keeps the real latent and caption widths: 32-channel latents, 2304-wide captions.
    torch::manual_seed(7);
    SanaTransformer model(SanaTransformerConfig::named("sana-tiny"));
    const at::Tensor x = torch::randn({2, 32, 16, 24});
    const at::Tensor caption = torch::randn({2, 5, 2304});
    const at::Tensor mask = torch::tensor({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}).view({2, 5});
    const at::Tensor out = model(x, caption, torch::tensor({250.0f, 900.0f}), mask);
    EXPECT_EQ(out.sizes(), x.sizes());
    torch::mse_loss(out, torch::zeros_like(out)).backward();
    for (const auto& p : model->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
    }
    // A scalar timestep applies to the whole batch.
    torch::NoGradGuard no_grad;
    const at::Tensor per_sample = model(x, caption, torch::tensor({500.0f, 500.0f}), mask);
    EXPECT_TRUE(torch::equal(model(x, caption, torch::tensor(500.0f), mask), per_sample));
}

TEST(SanaTransformer, RefusesBadInputShapesNamingTheInput) {
    SanaTransformer model = load_golden("transformer_pe");  // in_channels 8, patch 2, caption 24
    const at::Tensor x = torch::randn({2, 8, 4, 6}), caption = torch::randn({2, 3, 24});
    const at::Tensor t = torch::tensor({1.0f, 2.0f}), mask = torch::ones({2, 3});
    auto expect_refused = [&](const char* what, const std::function<void()>& call) {
        try {
            call();
            ADD_FAILURE() << what << " accepted";
        } catch (const sf::Error& e) {
            EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    torch::NoGradGuard no_grad;
    expect_refused("hidden_states", [&] { model(torch::randn({2, 8, 5, 6}), caption, t, mask); });
    expect_refused("hidden_states", [&] { model(torch::randn({2, 4, 4, 6}), caption, t, mask); });
    expect_refused("encoder_hidden_states", [&] { model(x, torch::randn({2, 3, 16}), t, mask); });
    expect_refused("timestep", [&] { model(x, caption, torch::ones({3}), mask); });
    expect_refused("encoder_attention_mask", [&] { model(x, caption, t, torch::ones({2, 4})); });
    EXPECT_EQ(model(x, caption, t, mask).sizes(), x.sizes());
}

// Forward and backward of one step; returns the input's gradient, every parameter's (cleared from
// the model) and the peak counted bytes.
struct ImageStep {
    at::Tensor input;
    std::map<std::string, at::Tensor> params;
    int64_t peak = 0;
};
ImageStep image_step(SanaTransformer& model, const at::Tensor& x, const at::Tensor& caption) {
    const at::Tensor input = x.clone().requires_grad_(true);
    sf::mem::reset_peak();
    const int64_t before = sf::mem::cpu_stats().current;
    model(input, caption, torch::full({x.size(0)}, 400.0)).pow(2).mean().backward();
    ImageStep g{input.grad(), {}, sf::mem::cpu_stats().peak - before};
    for (const auto& p : model->named_parameters()) {
        g.params[p.key()] = p.value().grad();
        p.value().mutable_grad() = at::Tensor();
    }
    return g;
}

TEST(SanaTransformer, ChunkedFeedForwardGivesTheSameResultsWithLessMemory) {
    auto config = SanaTransformerConfig::named("sana-tiny");
    config.caption_channels = 16;
    torch::manual_seed(4);
    SanaTransformer model(config);
    torch::manual_seed(5);
    // 13 rows (prime: no chunk size divides it) of 24 latents, wide enough that the FFN's hidden
    // activations dominate the step.
    const at::Tensor x = torch::randn({2, 32, 13, 24});
    const at::Tensor caption = torch::randn({2, 6, 16});
    const ImageStep plain = image_step(model, x, caption);
    at::Tensor plain_out;
    {
        torch::NoGradGuard no_grad;
        plain_out = model(x, caption, torch::full({2}, 400.0));
    }
    // One row (a halo on both sides of every chunk), chunks that leave a remainder, a chunk as
    // tall as the latent (no chunking), alone, inside checkpointed blocks (whose recompute
    // computes no value of the chunked feed-forward) and beside them.
    std::map<int64_t, int64_t> peak_of;  // chunk rows -> peak, not checkpointed
    for (const auto& [rows, every] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 0}, {3, 0}, {5, 0}, {13, 0}, {3, 1}, {2, 2}}) {
        const std::string what =
            "chunk " + std::to_string(rows) + ", checkpointing " + std::to_string(every);
        model->set_feed_forward_chunk(rows);
        model->set_gradient_checkpointing(every);
        {
            torch::NoGradGuard no_grad;
            expect_close(model(x, caption, torch::full({2}, 400.0)), plain_out, 1e-5, 1e-6,
                         "forward, " + what);
        }
        const ImageStep g = image_step(model, x, caption);
        expect_close(g.input, plain.input, 1e-4, 1e-7, "input gradient, " + what);
        for (const auto& [name, grad] : plain.params) {
            expect_close(g.params.at(name), grad, 1e-4, 1e-7, "grad." + name + ", " + what);
        }
        if (every == 0) peak_of[rows] = g.peak;
        if (rows == 3 && every == 0) {
            std::printf("[ memory   ] peak %lld bytes plain, %lld with 3-row chunks\n",
                        static_cast<long long>(plain.peak), static_cast<long long>(g.peak));
            EXPECT_LT(g.peak, plain.peak * 17 / 20) << "the 2.5x-wide hidden is kept whole";
        }
    }
    // Under bf16 autocast, checkpointed or not: every weight gets its gradient through the
    // chunks' recompute (the forward must not leave it a cached bf16 copy without grad_fn), as
    // close to the whole run's as bf16 allows.
    for (const int64_t every : {0, 1}) {
        model->set_gradient_checkpointing(every);
        model->set_feed_forward_chunk(0);
        ImageStep whole, chunked;
        {
            sf::model::AutocastGuard bf16(c10::DeviceType::CPU, at::kBFloat16);
            whole = image_step(model, x, caption);
        }
        model->set_feed_forward_chunk(3);
        {
            sf::model::AutocastGuard bf16(c10::DeviceType::CPU, at::kBFloat16);
            chunked = image_step(model, x, caption);
        }
        const std::string what = "bf16, checkpointing " + std::to_string(every);
        expect_close(chunked.input, whole.input, 2e-2, 1e-4, "input gradient, " + what);
        for (const auto& [name, grad] : whole.params) {
            ASSERT_TRUE(chunked.params.at(name).defined()) << name << ", " << what;
            expect_close(chunked.params.at(name), grad, 2e-2, 1e-4, "grad." + name + ", " + what);
        }
    }
    // Smaller chunks hold less, the edges' too: there a zero row stands in for the missing halo,
    // since a 2-row window costs oneDNN's depthwise conv a scratchpad of megabytes.
    EXPECT_LE(peak_of.at(1), peak_of.at(3)) << "1-row chunks";
    model->set_gradient_checkpointing(0);
    try {
        model->set_feed_forward_chunk(-1);
        ADD_FAILURE() << "a negative chunk accepted";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("feed-forward chunk"), std::string::npos) << e.what();
    }
}

}  // namespace
