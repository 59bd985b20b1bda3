// Per head and chunk, in the tokens' own layout (no transposing copies): with Q = relu(q),
// K = relu(k), V [n, d] and V_pad = [V, 1] [n, d + 1],
//   forward    kvT = sum K^T V_pad ([d, d + 1]: K^T V, and K's column sums for the ones);
//              O = Q kvT [n, d + 1];  out = O[:, :d] / (O[:, d] + 1e-15)
//   backward   with s = O[:, d] + 1e-15 and G the output's gradient:
//              dO[:, :d] = G / s,  dO[:, d] = -sum_i (G O[:, :d])_i / s^2
//              dkvT = sum Q^T dO,  dQ = dO kvT^T,  then dV = K dkvT[:, :d],
//              dK = V dkvT[:, :d]^T + dkvT[:, d]^T (each row), and the ReLUs pass dQ, dK where
//              q, k > 0.
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

// Tokens [start, start + n) of t [B, N, H * d] viewed [B, H, n, d]: a view of t, or an fp32 copy
// in t's layout (a plain conversion, no transposing copy).
at::Tensor heads_of(const at::Tensor& t, int64_t start, int64_t n, int64_t heads) {
    return t.narrow(1, start, n).view({t.size(0), n, heads, -1}).transpose(1, 2);
}
at::Tensor heads_fp32(const at::Tensor& t, int64_t start, int64_t n, int64_t heads) {
    const at::Tensor tokens =
        t.narrow(1, start, n)
            .to(at::kFloat, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
    return tokens.view({t.size(0), n, heads, -1}).transpose(1, 2);
}

// K^T V_pad of one chunk: [B, H, d, d + 1].
at::Tensor keys_values(const at::Tensor& keys, const at::Tensor& values) {
    return at::cat({at::matmul(keys.transpose(2, 3), values), keys.sum(2).unsqueeze(3)}, 3);
}

struct ReluLinearAttentionFunction : torch::autograd::Function<ReluLinearAttentionFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, int64_t heads, int64_t chunk) {
        NoAutocast no_autocast;
        const int64_t batch = q.size(0), tokens = q.size(1), d = q.size(2) / heads;
        at::Tensor kvt = at::zeros({batch, heads, d, d + 1}, q.options().dtype(at::kFloat));
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            kvt.add_(keys_values(at::relu(heads_fp32(k, start, n, heads)),
                                 heads_fp32(v, start, n, heads)));
        }
        at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor o = at::matmul(at::relu(heads_fp32(q, start, n, heads)), kvt);
            heads_of(out, start, n, heads).copy_(o.narrow(3, 0, d) / (o.narrow(3, d, 1) + 1e-15));
        }
        ctx->save_for_backward({q, k, v, kvt});
        ctx->saved_data["heads"] = heads;
        ctx->saved_data["chunk"] = chunk;
        return out;
    }

    // One slot per forward argument: q, k, v, heads, chunk.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        NoAutocast no_autocast;
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kvt = saved[3];
        const int64_t heads = ctx->saved_data.at("heads").toInt();
        const int64_t chunk = ctx->saved_data.at("chunk").toInt();
        const at::Tensor& grad_out = grad_outputs.at(0);  // [B, N, H * d]
        const bool want_q = ctx->needs_input_grad(0), want_k = ctx->needs_input_grad(1);
        const bool want_v = ctx->needs_input_grad(2);
        const int64_t tokens = q.size(1), d = kvt.size(2);

        at::Tensor dq = want_q ? at::empty_like(q, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dkvt = at::zeros_like(kvt);  // [B, H, d, d + 1]
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor q_pre = heads_fp32(q, start, n, heads);  // [B, H, n, d]
            const at::Tensor queries = at::relu(q_pre);
            const at::Tensor o = at::matmul(queries, kvt);  // [B, H, n, d + 1]
            const at::Tensor s = o.narrow(3, d, 1) + 1e-15;
            const at::Tensor g = heads_fp32(grad_out, start, n, heads) / s;  // dO[:, :d]
            const at::Tensor g_s = (g * o.narrow(3, 0, d)).sum(3, /*keepdim=*/true).div_(s).neg_();
            const at::Tensor d_o = at::cat({g, g_s}, 3);  // [B, H, n, d + 1]
            dkvt.add_(at::matmul(queries.transpose(2, 3), d_o));
            if (want_q) {
                const at::Tensor d_q = at::matmul(d_o, kvt.transpose(2, 3));  // [B, H, n, d]
                heads_of(dq, start, n, heads).copy_(at::threshold_backward(d_q, q_pre, 0));
            }
        }
        at::Tensor dk = want_k ? at::empty_like(k, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dv = want_v ? at::empty_like(v, at::MemoryFormat::Contiguous) : at::Tensor();
        if (!want_k && !want_v) return {dq, dk, dv, at::Tensor(), at::Tensor()};
        const at::Tensor dkvt_values = dkvt.narrow(3, 0, d);  // [B, H, d, d]
        for (int64_t start = 0; start < tokens; start += chunk) {
            const int64_t n = std::min(chunk, tokens - start);
            const at::Tensor k_pre = heads_fp32(k, start, n, heads);  // [B, H, n, d]
            if (want_v)
                heads_of(dv, start, n, heads).copy_(at::matmul(at::relu(k_pre), dkvt_values));
            if (want_k) {
                at::Tensor d_k = at::matmul(heads_fp32(v, start, n, heads),
                                            dkvt_values.transpose(2, 3));  // [B, H, n, d]
                d_k.add_(dkvt.select(3, d).unsqueeze(2));
                heads_of(dk, start, n, heads).copy_(at::threshold_backward(d_k, k_pre, 0));
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
