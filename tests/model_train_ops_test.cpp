// The training memory remedies against their plain references: gradient checkpointing (same
// gradients, RNG and autocast reproduced, parameter hooks fire, lower peak), the chunked
// attention kernel (same values and gradients as dense, lower peak) and the autocast guard.
// Memory is the counting CPU allocator's (tests/test_main.cpp installs it).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/autocast.h"
#include "model/common/checkpoint.h"
#include "model/common/chunked_attention.h"
#include "model/common/linear_attention.h"
#include "model/sana/sana_blocks.h"
#include "model/sana/sana_transformer.h"
#include "model_golden_util.h"
#include "model_module_run.h"

namespace {

using sf::model::AttentionKernel;
using sf::model::AutocastGuard;
using sf::model::AutocastState;
using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;
using sf::test::expect_close;

SanaTransformerConfig tiny_config(int64_t layers) {
    auto c = SanaTransformerConfig::named("sana-tiny");  // width 64, real latent/caption widths
    c.num_layers = layers;
    return c;
}

struct StepInputs {
    at::Tensor latents, caption, timestep, mask, weights;
};

// A batch of 2 with caption padding in the first sample; `weights` makes the loss's gradient
// differ per output element.
StepInputs step_inputs(int64_t height, int64_t width, bool with_mask = true) {
    torch::manual_seed(11);
    StepInputs in;
    in.latents = torch::randn({2, 32, height, width});
    in.caption = torch::randn({2, 6, 2304});
    in.timestep = torch::tensor({250.0f, 800.0f});
    if (with_mask) in.mask = torch::tensor({1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}).view({2, 6});
    in.weights = torch::randn({2, 32, height, width});
    return in;
}

struct StepGrads {
    std::map<std::string, at::Tensor> params;
    at::Tensor latents, caption;
    int checkpoint_nodes = 0;  // CheckpointFunction nodes in the step's graph
};

// The backward graph's nodes whose name contains `part`.
int count_nodes(const at::Tensor& t, const std::string& part) {
    std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
    std::set<torch::autograd::Node*> seen;
    int found = 0;
    while (!stack.empty()) {
        torch::autograd::Node* node = stack.back();
        stack.pop_back();
        if (!node || !seen.insert(node).second) continue;
        if (node->name().find(part) != std::string::npos) ++found;
        for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
    }
    return found;
}

StepGrads train_step(SanaTransformer& model, const StepInputs& in, bool input_grads = true) {
    model->zero_grad(/*set_to_none=*/true);
    const at::Tensor x = in.latents.clone().requires_grad_(input_grads);
    const at::Tensor c = in.caption.clone().requires_grad_(input_grads);
    const at::Tensor out = model(x, c, in.timestep, in.mask);
    const at::Tensor loss = (out * in.weights).sum();
    StepGrads g;
    g.checkpoint_nodes = count_nodes(loss, "CheckpointFunction");
    loss.backward();
    for (const auto& p : model->named_parameters()) {
        if (p.value().grad().defined()) g.params[p.key()] = p.value().grad().clone();
    }
    g.latents = x.grad();
    g.caption = c.grad();
    return g;
}

// Element-wise within `tol` relative to the element, or to the tensor's largest magnitude: a
// gradient summed in another order (the caption's, over the blocks) differs by rounding, which
// is large relative to its near-zero elements.
void expect_near(const at::Tensor& got, const at::Tensor& want, double tol,
                 const std::string& name) {
    ASSERT_TRUE(got.defined()) << name << " missing";
    const double scale = want.abs().max().item<double>();
    expect_close(got, want, tol, tol * scale, name);
}

void expect_same_grads(const StepGrads& got, const StepGrads& want, double tol) {
    ASSERT_EQ(got.params.size(), want.params.size());
    for (const auto& [name, grad] : want.params) {
        ASSERT_TRUE(got.params.count(name)) << "no gradient for " << name;
        expect_near(got.params.at(name), grad, tol, name);
    }
    if (want.latents.defined()) expect_near(got.latents, want.latents, tol, "d latents");
    if (want.caption.defined()) expect_near(got.caption, want.caption, tol, "d caption");
}

TEST(GradientCheckpointing, SanaTransformerGradientsMatchPlain) {
    torch::manual_seed(3);
    SanaTransformer model(tiny_config(4));
    model->train();
    for (bool with_mask : {true, false}) {  // no mask: an undefined checkpoint input
        const StepInputs in = step_inputs(8, 12, with_mask);
        model->set_gradient_checkpointing(0);
        const StepGrads plain = train_step(model, in);
        EXPECT_EQ(plain.checkpoint_nodes, 0);
        for (int64_t every : {1, 2}) {
            SCOPED_TRACE("every " + std::to_string(every) + (with_mask ? " mask" : " no mask"));
            model->set_gradient_checkpointing(every);
            const StepGrads ckpt = train_step(model, in);
            EXPECT_EQ(ckpt.checkpoint_nodes, every == 1 ? 4 : 2);  // blocks 0-3, or 0 and 2
            expect_same_grads(ckpt, plain, 1e-5);
        }
    }
    model->set_gradient_checkpointing(0);
    EXPECT_THROW(model->set_gradient_checkpointing(-1), sf::Error);
}

TEST(GradientCheckpointing, FrozenEmbedderStillTrainsCheckpointedBlocks) {
    // LoRA-style: nothing in front of the blocks requires grad, so no block input does; the
    // block parameters must get their gradients all the same.
    torch::manual_seed(4);
    SanaTransformer model(tiny_config(2));
    for (const auto& p : model->named_parameters()) {
        if (p.key().rfind("transformer_blocks.", 0) != 0) p.value().requires_grad_(false);
    }
    const StepInputs in = step_inputs(8, 8);
    const StepGrads plain = train_step(model, in, /*input_grads=*/false);
    model->set_gradient_checkpointing(1);
    const StepGrads ckpt = train_step(model, in, /*input_grads=*/false);
    EXPECT_EQ(ckpt.checkpoint_nodes, 2);
    EXPECT_EQ(plain.params.size(), 38u);  // 19 tensors per block
    expect_same_grads(ckpt, plain, 1e-5);
}

TEST(GradientCheckpointing, ParameterPostHooksRunOnceAndCanStepTheOptimizer) {
    // A fused optimizer steps each parameter from a post hook on its gradient accumulator and
    // drops the gradient; with checkpointing the hooks run inside the nested backward.
    struct SgdHook : torch::autograd::FunctionPostHook {
        SgdHook(at::Tensor p, int* calls) : param(std::move(p)), calls(calls) {}
        torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                                  const torch::autograd::variable_list&) override {
            ++*calls;
            torch::NoGradGuard no_grad;
            param.sub_(param.grad() * 0.1);
            param.mutable_grad() = at::Tensor();
            return outputs;
        }
        at::Tensor param;
        int* calls;
    };
    const StepInputs in = step_inputs(8, 8);
    auto run = [&](int64_t every, bool hooks) {
        torch::manual_seed(5);
        SanaTransformer model(tiny_config(2));
        model->set_gradient_checkpointing(every);
        std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps the hooks
        std::vector<int> calls(model->parameters().size(), 0);
        if (hooks) {
            size_t i = 0;
            for (auto& p : model->parameters()) {
                accumulators.push_back(torch::autograd::impl::grad_accumulator(p));
                accumulators.back()->add_post_hook(std::make_unique<SgdHook>(p, &calls[i++]));
            }
        }
        train_step(model, in);
        if (!hooks) {
            torch::NoGradGuard no_grad;
            for (auto& p : model->parameters()) p.sub_(p.grad() * 0.1);
        }
        for (int c : calls) EXPECT_EQ(c, hooks ? 1 : 0);
        return model;
    };
    SanaTransformer reference = run(0, false);
    SanaTransformer fused = run(1, true);
    const auto want = reference->named_parameters();
    for (const auto& p : fused->named_parameters()) {
        EXPECT_FALSE(p.value().grad().defined()) << p.key();
        expect_close(p.value(), want[p.key()], 1e-5, 1e-6, "stepped " + p.key());
    }
}

TEST(GradientCheckpointing, DropoutDrawsTheSameMaskAndTheCallerRngIsRestored) {
    torch::manual_seed(6);
    torch::nn::Linear linear(16, 16);
    const at::Tensor x0 = torch::randn({8, 16});
    auto fn = [&](const std::vector<at::Tensor>& t) {
        return torch::dropout(linear(t[0]), 0.5, /*train=*/true).tanh();
    };
    auto run = [&](bool ckpt) {
        linear->zero_grad(true);
        const at::Tensor x = x0.clone().requires_grad_(true);
        torch::manual_seed(42);
        const at::Tensor y = ckpt ? sf::model::checkpoint(fn, {x}) : fn({x});
        // The caller draws between forward and backward: the recompute must not rewind that.
        const at::Tensor between = torch::rand({3});
        y.pow(2).sum().backward();
        const at::Tensor next_draw = torch::rand({4});
        return std::vector<at::Tensor>{y.detach(), x.grad(), linear->weight.grad().clone(),
                                       at::cat({between, next_draw})};
    };
    const auto plain = run(false), ckpt = run(true);
    EXPECT_TRUE(torch::equal(ckpt[0], plain[0])) << "forward";
    EXPECT_TRUE(torch::equal(ckpt[1], plain[1])) << "input gradient";
    EXPECT_TRUE(torch::equal(ckpt[2], plain[2])) << "weight gradient";
    EXPECT_TRUE(torch::equal(ckpt[3], plain[3])) << "the caller's generator moved";
}

TEST(GradientCheckpointing, RecomputeRunsUnderTheForwardsAutocastState) {
    torch::manual_seed(7);
    torch::nn::Linear a(32, 64), b(64, 32);
    const at::Tensor x0 = torch::randn({16, 32});
    std::vector<AutocastState> seen;
    auto fn = [&](const std::vector<at::Tensor>& t) {
        seen.push_back(AutocastState::capture());
        return b(torch::gelu(a(t[0])));
    };
    // backward_inside: the backward runs in the autocast scope too, where the forward's casts
    // of the weights, made without grad, must not be reused by the recompute.
    auto run = [&](bool ckpt, bool backward_inside) {
        a->zero_grad(true);
        b->zero_grad(true);
        const at::Tensor x = x0.clone().requires_grad_(true);
        at::Tensor y;
        {
            AutocastGuard bf16(at::kCPU, at::kBFloat16);
            y = ckpt ? sf::model::checkpoint(fn, {x}) : fn({x});
            EXPECT_EQ(y.scalar_type(), at::kBFloat16);
            if (backward_inside) y.to(at::kFloat).pow(2).sum().backward();
        }
        if (!backward_inside) y.to(at::kFloat).pow(2).sum().backward();
        const bool all =
            a->weight.grad().defined() && b->weight.grad().defined() && b->bias.grad().defined();
        EXPECT_TRUE(all) << "a weight got no gradient";
        if (!all) return StepGrads{};
        StepGrads g;
        g.params = {{"a.weight", a->weight.grad().clone()},
                    {"b.weight", b->weight.grad().clone()},
                    {"b.bias", b->bias.grad().clone()}};
        g.latents = x.grad();
        return g;
    };
    for (bool inside : {false, true}) {
        SCOPED_TRACE(inside ? "backward inside the scope" : "backward after the scope");
        const StepGrads plain = run(false, inside);
        seen.clear();
        const StepGrads ckpt = run(true, inside);
        ASSERT_EQ(seen.size(), 2u);  // forward and recompute
        EXPECT_TRUE(seen[1].cpu_enabled);
        EXPECT_EQ(seen[1].cpu_dtype, at::kBFloat16);
        EXPECT_EQ(seen[1].cpu_enabled, seen[0].cpu_enabled);
        expect_same_grads(ckpt, plain, 1e-6);
    }
    EXPECT_FALSE(AutocastState::capture().cpu_enabled);
}

// Counted bytes above the starting point at the peak of `step`.
template <typename Step>
int64_t peak_bytes(Step&& step) {
    sf::mem::reset_peak();
    const int64_t before = sf::mem::cpu_stats().current;
    step();
    return sf::mem::cpu_stats().peak - before;
}

TEST(GradientCheckpointing, LowersThePeakOfATrainingStep) {
    torch::manual_seed(8);
    SanaTransformer model(tiny_config(4));
    const StepInputs in = step_inputs(64, 64);  // 4096 tokens per sample
    auto step = [&] { train_step(model, in); };
    step();  // warm-up: first-use allocations (thread pools, oneDNN) out of the numbers
    const int64_t plain = peak_bytes(step);
    model->set_gradient_checkpointing(1);
    const int64_t ckpt = peak_bytes(step);
    model->set_gradient_checkpointing(2);
    const int64_t half = peak_bytes(step);
    std::printf(
        "[ memory   ] 4-block step at 64x64: plain %.1f MB, every 2 %.1f MB, every 1 "
        "%.1f MB\n",
        plain / 1e6, half / 1e6, ckpt / 1e6);
    // Measured: every 1 at 0.30 of plain, every 2 at 0.53.
    EXPECT_LT(ckpt, 0.45 * plain);
    EXPECT_LT(half, 0.7 * plain);
    EXPECT_LT(ckpt, half);
}

// q [2, 3, N, 16], k and v [2, 3, L, 16]; bias [2, 1, 1, L] with the last keys of sample 0
// padded as the model does (-10000).
struct AttentionInputs {
    at::Tensor q, k, v, bias, grad_out;
};

AttentionInputs attention_inputs(int64_t n, int64_t l) {
    torch::manual_seed(9);
    AttentionInputs in;
    in.q = torch::randn({2, 3, n, 16});
    in.k = torch::randn({2, 3, l, 16});
    in.v = torch::randn({2, 3, l, 16});
    at::Tensor keep = torch::ones({2, l});
    keep.index_put_({0, torch::indexing::Slice(l - 3, torch::indexing::None)}, 0.0);
    in.bias = ((1 - keep) * -10000.0).view({2, 1, 1, l});
    in.grad_out = torch::randn({2, 3, n, 16});
    return in;
}

// Output and the gradients of q, k, v, with `dtype` leaf copies of the inputs.
std::vector<at::Tensor> attention_grads(
    const AttentionInputs& in, at::ScalarType dtype,
    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&)>& kernel) {
    const at::Tensor q = in.q.to(dtype).clone().requires_grad_(true);
    const at::Tensor k = in.k.to(dtype).clone().requires_grad_(true);
    const at::Tensor v = in.v.to(dtype).clone().requires_grad_(true);
    const at::Tensor out = kernel(q, k, v, in.bias);
    EXPECT_EQ(out.scalar_type(), dtype);
    out.backward(in.grad_out.to(dtype));
    return {out.detach(), q.grad(), k.grad(), v.grad()};
}

TEST(ChunkedAttention, MatchesDenseValuesAndGradients) {
    const AttentionInputs in = attention_inputs(37, 11);
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (bool masked : {true, false}) {
        AttentionInputs inputs = in;
        if (!masked) inputs.bias = at::Tensor();
        const auto dense = attention_grads(inputs, at::kFloat, sf::model::dense_attention);
        for (int64_t chunk : {1, 5, 8, 37, 64}) {  // 5 and 8 leave a short last chunk
            SCOPED_TRACE("chunk " + std::to_string(chunk) + (masked ? " masked" : ""));
            const auto got = attention_grads(inputs, at::kFloat, [&](auto&&... a) {
                return sf::model::chunked_attention(a..., chunk);
            });
            for (int i = 0; i < 4; ++i) expect_close(got[i], dense[i], 1e-5, 1e-5, names[i]);
        }
    }
    // bf16 inputs: fp32 math inside, bf16 out; against dense fp32 on the same rounded values.
    AttentionInputs rounded = in;
    for (at::Tensor* t : {&rounded.q, &rounded.k, &rounded.v, &rounded.grad_out}) {
        *t = t->to(at::kBFloat16).to(at::kFloat);
    }
    const auto dense = attention_grads(rounded, at::kFloat, sf::model::dense_attention);
    const auto got = attention_grads(
        rounded, at::kBFloat16, [](auto&&... a) { return sf::model::chunked_attention(a..., 6); });
    for (int i = 0; i < 4; ++i) expect_close(got[i], dense[i], 2e-2, 2e-2, names[i]);
}

TEST(ChunkedAttention, RefusesBadArguments) {
    const AttentionInputs in = attention_inputs(8, 5);
    auto refused = [](const std::function<void()>& call, const std::string& words) {
        try {
            call();
            ADD_FAILURE() << "accepted: " << words;
        } catch (const sf::Error& e) {
            EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
    };
    using sf::model::chunked_attention;
    refused([&] { chunked_attention(in.q, in.k, in.v, in.bias, 0); }, "chunk");
    refused([&] { chunked_attention(in.q, in.k.narrow(3, 0, 8), in.v, in.bias, 4); }, "mismatch");
    refused([&] { chunked_attention(in.q, in.k, in.v.narrow(2, 0, 4), in.bias, 4); }, "mismatch");
    refused([&] { chunked_attention(in.q, in.k, in.v, torch::zeros({2, 1, 8, 5}), 4); }, "per-key");
    refused([&] { chunked_attention(in.q[0], in.k, in.v, in.bias, 4); }, "4-D");
    using sf::model::relu_linear_attention;
    const at::Tensor x = torch::randn({2, 6, 8});
    refused([&] { relu_linear_attention(x, x, x, 2, 0); }, "chunk");
    refused([&] { relu_linear_attention(x, x, x, 3, 4); }, "do not divide");
    refused([&] { relu_linear_attention(x, x.narrow(1, 0, 5), x, 2, 4); }, "alike");
    refused([&] { relu_linear_attention(x, x, x.to(at::kDouble), 2, 4); }, "dtype");
    torch::manual_seed(1);
    SanaTransformer model(tiny_config(1));
    EXPECT_THROW(model->set_attention(AttentionKernel::kChunked, 0), sf::Error);
}

TEST(ChunkedAttention, LowersThePeakWellBelowDense) {
    // 16K image tokens (a 4K-pixel latent) against 300 caption tokens, 2 heads.
    torch::manual_seed(10);
    const at::Tensor q0 = torch::randn({1, 2, 16384, 32}), k0 = torch::randn({1, 2, 300, 32});
    const at::Tensor v0 = torch::randn({1, 2, 300, 32}), g = torch::randn({1, 2, 16384, 32});
    auto measure = [&](AttentionKernel kernel) {
        return peak_bytes([&] {
            const at::Tensor q = q0.clone().requires_grad_(true);
            const at::Tensor k = k0.clone().requires_grad_(true);
            const at::Tensor v = v0.clone().requires_grad_(true);
            sf::model::attention(kernel, q, k, v, at::Tensor(), 1024).backward(g);
        });
    };
    measure(AttentionKernel::kChunked);  // warm-up
    const int64_t dense = measure(AttentionKernel::kDense);
    const int64_t chunked = measure(AttentionKernel::kChunked);
    const double matrix = 16384.0 * 300 * 2 * 4;  // one [H, N, L] fp32 matrix
    std::printf(
        "[ memory   ] attention fwd+bwd N 16384, L 300: dense %.1f MB, chunked %.1f MB "
        "(one score matrix %.1f MB)\n",
        dense / 1e6, chunked / 1e6, matrix / 1e6);
    EXPECT_LT(chunked, 0.3 * dense);  // measured 0.14
    EXPECT_LT(chunked, matrix);       // never the whole score matrix
}

TEST(ChunkedAttention, SanaTransformerKernelsAgree) {
    torch::manual_seed(12);
    SanaTransformer model(tiny_config(2));
    const StepInputs in = step_inputs(8, 10);
    StepGrads dense = train_step(model, in);
    model->set_attention(AttentionKernel::kChunked, 7);  // 80 tokens: chunks of 7, last of 3
    StepGrads chunked = train_step(model, in);
    model->set_attention(AttentionKernel::kFused, 16);
    StepGrads fused = train_step(model, in);
    // attn2.to_k's bias cannot change a softmax over keys (it shifts every score of a row by the
    // same amount): its gradient is zero up to rounding noise, which differs between kernels.
    for (StepGrads* g : {&dense, &chunked, &fused}) {
        for (const char* name :
             {"transformer_blocks.0.attn2.to_k.bias", "transformer_blocks.1.attn2.to_k.bias"}) {
            ASSERT_TRUE(g->params.count(name)) << name;
            EXPECT_LT(g->params.at(name).abs().max().item<double>(), 1e-5) << name;
            g->params.erase(name);
        }
    }
    expect_same_grads(chunked, dense, 1e-4);
    expect_same_grads(fused, dense, 1e-4);
}

// The linear self-attention over token chunks (relu_linear_attention: kv summed over chunks, then
// each chunk's output): the whole run's output and gradients, in fp32 and under bf16 autocast,
// with a lower peak.
TEST(ChunkedAttention, LinearSelfAttentionOverTokenChunksEqualsTheWholeRun) {
    torch::manual_seed(13);
    sf::model::SanaLinearAttention attn(64, 4, 16, /*bias=*/false, /*dropout=*/0.0);
    const at::Tensor x0 = torch::randn({2, 4096, 64}), g = torch::randn({2, 4096, 64});
    using Run = sf::test::ModuleRun;
    auto run = [&](int64_t chunk, bool bf16) {
        attn->chunk_tokens = chunk;
        return sf::test::run_module(
            *attn, [&](const at::Tensor& x) { return attn(x); }, x0, g, bf16);
    };
    const Run whole = run(0, false);
    for (const int64_t chunk : {1000, 512, 4096}) {  // 1000 leaves a short last chunk
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const Run chunked = run(chunk, false);
        expect_close(chunked.out, whole.out, 1e-5, 1e-5, "out");
        expect_close(chunked.grad_x, whole.grad_x, 1e-5, 1e-5, "grad x");
        for (const auto& [name, grad] : whole.grads)
            expect_close(chunked.grads.at(name), grad, 1e-5, 1e-5, "grad." + name);
        if (chunk == 512) {
            std::printf(
                "[ memory   ] linear attention N 4096, fp32: whole %.1f MB, 512-token chunks "
                "%.1f MB\n",
                whole.peak / 1e6, chunked.peak / 1e6);
            // The kernel keeps q, k, v and kv; the plain ops also their ReLUs and products.
            EXPECT_LT(chunked.peak, whole.peak * 4 / 5);
        }
    }
    // Under bf16 autocast each chunk's weight gradients are rounded to bf16 before they are
    // summed (in fp32), the whole run's once: both are held to the fp32 run, and the chunked
    // one is no further from it.
    const auto rel = sf::test::relative_error;
    const Run whole_bf16 = run(0, true), chunked_bf16 = run(1000, true);
    std::printf(
        "[ memory   ] linear attention N 4096, bf16: whole %.1f MB, 1000-token chunks "
        "%.1f MB\n",
        whole_bf16.peak / 1e6, chunked_bf16.peak / 1e6);
    // Under autocast the kernel keeps the bf16 q, k, v only; fp32 copies of them, which the
    // plain ops keep (6.3 MB here), would take it past the whole run's peak.
    EXPECT_LT(chunked_bf16.peak, whole_bf16.peak) << "fp32 q, k, v kept whole";
    EXPECT_LT(rel(chunked_bf16.out, whole.out), 1.5 * rel(whole_bf16.out, whole.out) + 1e-3);
    EXPECT_LT(rel(chunked_bf16.grad_x, whole.grad_x),
              1.5 * rel(whole_bf16.grad_x, whole.grad_x) + 1e-3);
    for (const auto& [name, grad] : whole.grads) {
        const double err = rel(chunked_bf16.grads.at(name), grad);
        const double whole_err = rel(whole_bf16.grads.at(name), grad);
        std::printf("[ bf16     ] %-16s relative error to fp32: whole %.4f, chunked %.4f\n",
                    name.c_str(), whole_err, err);
        // How far bf16 lands depends on the CPU's kernels: chunked 0.08 at most on an Intel CPU,
        // 0.103 on an AMD EPYC without AVX-512 (whose whole-run error is 0.92).
        EXPECT_LT(err, 0.2) << name;
        EXPECT_LT(err, 1.5 * whole_err + 1e-3) << name;
    }
    // The transformer sets it with the memory-saving kinds only.
    SanaTransformer model(tiny_config(1));
    const auto block =
        std::dynamic_pointer_cast<sf::model::SanaTransformerBlockImpl>(model->blocks().at(0));
    ASSERT_TRUE(block);
    model->set_attention(AttentionKernel::kChunked, 7);
    EXPECT_EQ(block->attn1->chunk_tokens, 7);
    model->set_attention(AttentionKernel::kDense, 7);
    EXPECT_EQ(block->attn1->chunk_tokens, 0);
}

// SanaRMSNorm as one autograd node: upstream's plain ops' values and gradients (fp32, a bf16 input
// as autocast's projections give it, and bf16 weights as a LoRA run's frozen base has), keeping
// less for backward.
TEST(RMSNorm, OneNodeEqualsThePlainOpsAndKeepsLess) {
    torch::manual_seed(31);
    const at::Tensor w0 = torch::rand({256}) + 0.5;
    const at::Tensor x0 = torch::randn({2, 4096, 256}) * 3, g = torch::randn({2, 4096, 256});
    for (const at::ScalarType input : {at::kFloat, at::kBFloat16}) {
        for (const at::ScalarType weights : {at::kFloat, at::kBFloat16}) {
            SCOPED_TRACE(std::string(c10::toString(input)) + " input, " + c10::toString(weights) +
                         " weight");
            sf::model::SanaRMSNorm norm(256, 1e-5);
            {
                torch::NoGradGuard no_grad;
                norm->weight.copy_(w0);
            }
            norm->to(weights);
            // diffusers' RMSNorm, operation by operation.
            auto plain = [&](const at::Tensor& x) {
                const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
                at::Tensor y = x * at::rsqrt(variance + norm->eps);
                if (weights != at::kFloat) y = y.to(weights);
                return y * norm->weight;
            };
            // The values and gradients; `kept` is what the forward holds for backward beyond its
            // input and output.
            auto run = [&](bool fused, int64_t& kept) {
                const at::Tensor x = x0.clone().to(input).requires_grad_(true);
                const int64_t before = sf::mem::cpu_stats().current;
                const at::Tensor out = fused ? norm(x) : plain(x);
                kept = sf::mem::cpu_stats().current - before - static_cast<int64_t>(out.nbytes());
                out.backward(g.to(out.scalar_type()));
                std::map<std::string, at::Tensor> r = {
                    {"out", out.detach()},
                    {"grad x", x.grad().to(at::kFloat)},
                    {"grad w", norm->weight.grad().to(at::kFloat)}};
                norm->weight.mutable_grad() = at::Tensor();
                return r;
            };
            int64_t fused_kept = 0, plain_kept = 0;
            const auto ours = run(true, fused_kept), theirs = run(false, plain_kept);
            EXPECT_TRUE(ours.at("out").equal(theirs.at("out"))) << "forward values differ";
            for (const char* name : {"grad x", "grad w"}) {
                // fp32: to rounding. bf16: the plain ops round each product to bf16 before the
                // sum, the one node once at the end; both within a few bf16 steps of the scale.
                const at::Tensor& a = ours.at(name);
                const at::Tensor& b = theirs.at(name);
                const bool exact = input == at::kFloat && weights == at::kFloat;
                const double scale = b.abs().max().item<double>();
                expect_close(a, b, exact ? 1e-5 : 2e-2, exact ? 1e-6 * scale : 2e-2 * scale, name);
            }
            std::printf(
                "[ memory   ] rms norm [2, 4096, 256] %s in, %s weight, kept for "
                "backward: plain %.2f MB, one node %.2f MB\n",
                c10::toString(input), c10::toString(weights), plain_kept / 1e6, fused_kept / 1e6);
            // The one node keeps a float per row; the plain ops at least a half-precision
            // product of x's size (LibTorch 1.13 keeps more than 2.x: 16.8 MB against 8.4 in fp32).
            EXPECT_LE(fused_kept, 2 * 4096 * 4 + 1024);
            EXPECT_GE(plain_kept, x0.numel() * 2);
        }
    }
}

TEST(Autocast, NestedGuardsRestoreThePreviousState) {
    const AutocastState outside = AutocastState::capture();
    const int nesting = sf::model::autocast_nesting();
    ASSERT_FALSE(outside.cpu_enabled);
    {
        AutocastGuard bf16(at::kCPU, at::kBFloat16);
        const AutocastState in1 = AutocastState::capture();
        EXPECT_TRUE(in1.cpu_enabled);
        EXPECT_EQ(in1.cpu_dtype, at::kBFloat16);
        EXPECT_EQ(in1.cuda_enabled, outside.cuda_enabled);
        EXPECT_EQ(sf::model::autocast_nesting(), nesting + 1);
        {
            AutocastGuard off(at::kCPU, at::kBFloat16, /*enabled=*/false);
            EXPECT_FALSE(AutocastState::capture().cpu_enabled);
            EXPECT_EQ(sf::model::autocast_nesting(), nesting + 2);
            AutocastGuard cuda(at::kCUDA, at::kBFloat16);
            EXPECT_TRUE(AutocastState::capture().cuda_enabled);
            EXPECT_EQ(AutocastState::capture().cuda_dtype, at::kBFloat16);
        }
        EXPECT_EQ(AutocastState::capture(), in1);
        EXPECT_THROW(AutocastGuard(at::kCPU, at::kFloat), sf::Error);
        EXPECT_EQ(AutocastState::capture(), in1) << "a refused guard changed the state";
        EXPECT_EQ(sf::model::autocast_nesting(), nesting + 1);
    }
    EXPECT_EQ(AutocastState::capture(), outside);
    EXPECT_EQ(sf::model::autocast_nesting(), nesting);
}

TEST(Autocast, CastCacheLivesUntilTheOutermostScopeExits) {
    // A weight changed in place inside a scope is seen through its cached bf16 copy until the
    // outermost scope exits; an inner scope's exit must not clear it, the outer one's must.
    torch::manual_seed(13);
    const at::Tensor w = torch::randn({8, 8}).requires_grad_(true);
    const at::Tensor x = torch::randn({4, 8});
    auto bump = [&] {
        torch::NoGradGuard no_grad;
        w.add_(1.0);
    };
    at::Tensor first;
    {
        AutocastGuard outer(at::kCPU, at::kBFloat16);
        first = at::linear(x, w);
        { AutocastGuard inner(at::kCPU, at::kBFloat16); }
        bump();
        EXPECT_TRUE(torch::equal(at::linear(x, w), first)) << "no cached cast: the test is void";
    }
    AutocastGuard again(at::kCPU, at::kBFloat16);
    EXPECT_FALSE(torch::equal(at::linear(x, w), first)) << "the cache outlived its scope";
}

// What the guard turns on is autocast's own casting, whichever LibTorch API sets it (the per-device
// functions of 1.13, the device-type ones of 2.4 and later: core/torch_compat.h): a matmul under
// the guard gives bit for bit the bf16 matmul of bf16-cast inputs, and leaves fp32 inputs fp32
// outside it.
TEST(Autocast, CastsExactlyAsExplicitBf16Inputs) {
    torch::manual_seed(14);
    const at::Tensor x = torch::randn({5, 16}), w = torch::randn({8, 16}), b = torch::randn({8});
    at::Tensor linear, matmul;
    {
        AutocastGuard bf16(at::kCPU, at::kBFloat16);
        linear = at::linear(x, w, b);
        matmul = at::matmul(x, w.t());
    }
    EXPECT_EQ(linear.scalar_type(), at::kBFloat16);
    EXPECT_EQ(matmul.scalar_type(), at::kBFloat16);
    const auto cast = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
    EXPECT_TRUE(torch::equal(linear, at::linear(cast(x), cast(w), cast(b))));
    EXPECT_TRUE(torch::equal(matmul, at::matmul(cast(x), cast(w).t())));
    EXPECT_EQ(at::linear(x, w, b).scalar_type(), at::kFloat);
}

}  // namespace
