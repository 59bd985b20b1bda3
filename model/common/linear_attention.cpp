// Per head and chunk, with Q = relu(q) [d, n], K = relu(k)^T [n, d], V_pad = [v; 1] [d + 1, n]:
//   forward    kv = sum V_pad K  ([d + 1, d]);  O = kv Q;  out = O[:d] / (O[d] + 1e-15)
//   backward   with s = O[d] + 1e-15 and G the output's gradient:
//              dO[:d] = G / s,  dO[d] = -sum_i (G O[:d])_i / s^2
//              dkv = sum dO Q^T,  dQ = kv^T dO,  then dV_pad = dkv K^T,  dK = V_pad^T dkv,
//              and the ReLUs pass dQ, dK where q, k > 0.
#include "model/common/linear_attention.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "core/shape.h"
#include "model/common/autocast.h"

namespace sf::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tokens [start, start + n) of t [B, N, H * d] as fp32 [B, H, d, n], contiguous: the
// element-wise ops between these and the matmuls' results then run on one layout.
at::Tensor heads_first(const at::Tensor& t, int64_t start, int64_t n, int64_t heads) {
    return t.narrow(1, start, n)
        .transpose(1, 2)
        .reshape({t.size(0), heads, -1, n})
        .to(at::kFloat, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
}

// Writes x [B, H, d, n] into tokens [start, start + n) of out [B, N, H * d] (in out's dtype).
void put_tokens(at::Tensor& out, int64_t start, const at::Tensor& x) {
    const int64_t n = x.size(3);
    out.narrow(1, start, n).copy_(x.reshape({x.size(0), -1, n}).transpose(1, 2));
}

// V_pad of tokens [start, start + n): [B, H, d + 1, n], fp32.
at::Tensor padded_values(const at::Tensor& v, int64_t start, int64_t n, int64_t heads) {
    return at::constant_pad_nd(heads_first(v, start, n, heads), {0, 0, 0, 1}, 1.0);
}

struct ReluLinearAttentionFunction : torch::autograd::Function<ReluLinearAttentionFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, int64_t heads, int64_t chunk) {
        NoAutocast no_autocast;
        const int64_t batch = q.size(0), tokens = q.size(1), d = q.size(2) / heads;
        at::Tensor kv = at::zeros({batch, heads, d + 1, d}, q.options().dtype(at::kFloat));
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor keys = at::relu(heads_first(k, start, n, heads)).transpose(2, 3);
            kv.add_(at::matmul(padded_values(v, start, n, heads), keys));
        }
        at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor o = at::matmul(kv, at::relu(heads_first(q, start, n, heads)));
            put_tokens(out, start, o.narrow(2, 0, d) / (o.narrow(2, d, 1) + 1e-15));
        }
        ctx->save_for_backward({q, k, v, kv});
        ctx->saved_data["heads"] = heads;
        ctx->saved_data["chunk"] = chunk;
        return out;
    }

    // One slot per forward argument: q, k, v, heads, chunk.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        NoAutocast no_autocast;
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kv = saved[3];
        const int64_t heads = ctx->saved_data.at("heads").toInt();
        const int64_t chunk = ctx->saved_data.at("chunk").toInt();
        const at::Tensor& grad_out = grad_outputs.at(0);  // [B, N, H * d]
        const bool want_q = ctx->needs_input_grad(0), want_k = ctx->needs_input_grad(1);
        const bool want_v = ctx->needs_input_grad(2);
        const int64_t tokens = q.size(1), d = kv.size(3);

        at::Tensor dq = want_q ? at::empty_like(q, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dkv = at::zeros_like(kv);  // [B, H, d + 1, d]
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor q_pre = heads_first(q, start, n, heads);  // [B, H, d, n]
            const at::Tensor queries = at::relu(q_pre);
            const at::Tensor o = at::matmul(kv, queries);  // [B, H, d + 1, n]
            const at::Tensor s = o.narrow(2, d, 1) + 1e-15;
            const at::Tensor g = heads_first(grad_out, start, n, heads) / s;  // dO[:d]
            const at::Tensor g_s = (g * o.narrow(2, 0, d)).sum(2, /*keepdim=*/true).div_(s).neg_();
            const at::Tensor d_o = at::cat({g, g_s}, 2);  // [B, H, d + 1, n]
            dkv.add_(at::matmul(d_o, queries.transpose(2, 3)));
            if (want_q) {
                const at::Tensor d_q = at::matmul(kv.transpose(2, 3), d_o);  // [B, H, d, n]
                put_tokens(dq, start, at::threshold_backward(d_q, q_pre, 0));
            }
        }
        at::Tensor dk = want_k ? at::empty_like(k, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dv = want_v ? at::empty_like(v, at::MemoryFormat::Contiguous) : at::Tensor();
        if (!want_k && !want_v) return {dq, dk, dv, at::Tensor(), at::Tensor()};
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor k_pre = heads_first(k, start, n, heads);  // [B, H, d, n]
            const at::Tensor keys = at::relu(k_pre);
            if (want_v) put_tokens(dv, start, at::matmul(dkv.narrow(2, 0, d), keys));
            if (want_k) {
                // dK^T = dkv^T V_pad: [B, H, d, n], the layout of k_pre.
                const at::Tensor d_k =
                    at::matmul(dkv.transpose(2, 3), padded_values(v, start, n, heads));
                put_tokens(dk, start, at::threshold_backward(d_k, k_pre, 0));
            }
        }
        return {dq, dk, dv, at::Tensor(), at::Tensor()};
    }
};

}  // namespace

at::Tensor relu_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t heads, int64_t chunk) {
    const auto bad = [](const std::string& what) {
        throw Error::InvalidArgument("relu_linear_attention: " + what);
    };
    if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 3 ||
        !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
        bad(fmt::format("q, k, v must be [B, N, H * d] alike; got {}, {}, {}",
                        q.defined() ? shape_string(q) : "undefined",
                        k.defined() ? shape_string(k) : "undefined",
                        v.defined() ? shape_string(v) : "undefined"));
    }
    if (heads < 1 || q.size(2) % heads != 0) {
        bad(fmt::format("{} heads do not divide the width {}", heads, q.size(2)));
    }
    if (chunk < 1) bad(fmt::format("chunk must be at least 1, got {}", chunk));
    if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() ||
        k.device() != q.device() || v.device() != q.device()) {
        bad("q, k and v must share dtype and device");
    }
    return ReluLinearAttentionFunction::apply(q, k, v, heads, chunk);
}

}  // namespace sf::model
