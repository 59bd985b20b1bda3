// The chunked kernel is the flash-attention algorithm at the granularity of ATen ops: per chunk
// of query rows the [B, H, c, L] scores are made, reduced to one log-sum-exp per row and turned
// into probabilities, used, and freed. Backward recomputes them from the saved log-sum-exp,
// with ds = p * (dp - rowsum(dO * O)), the softmax gradient without the [N, L] matrix.
#include "model/common/chunked_attention.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/shape.h"
#include "core/torch_compat.h"
#include "model/common/autocast.h"

namespace sf::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[noreturn]] void bad(const std::string& what) {
    throw Error::InvalidArgument("chunked_attention: " + what);
}

// Checks the shapes and returns `bias` viewed as 4-D, [1 or B, 1, 1, 1 or L], or undefined.
at::Tensor checked_bias(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& bias) {
    if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 4 || k.dim() != 4 ||
        v.dim() != 4) {
        bad(
            fmt::format("q, k, v must be 4-D [B, H, N, d], [B, H, L, d], [B, H, L, d]; got {}, "
                        "{}, {}",
                        shape_string(q), shape_string(k), shape_string(v)));
    }
    if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || k.size(1) != q.size(1) ||
        v.size(1) != q.size(1) || k.size(3) != q.size(3) || v.size(2) != k.size(2)) {
        bad(
            fmt::format("mismatched shapes q {}, k {}, v {} (want [B, H, N, d], [B, H, L, d], "
                        "[B, H, L, dv])",
                        shape_string(q), shape_string(k), shape_string(v)));
    }
    if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() ||
        k.device() != q.device() || v.device() != q.device()) {
        bad("q, k and v must share dtype and device");
    }
    if (!bias.defined()) return bias;
    const int64_t batch = q.size(0), keys = k.size(2);
    std::vector<int64_t> sizes(bias.sizes().begin(), bias.sizes().end());
    if (sizes.size() > 4)
        bad(fmt::format("bias {} has more than 4 dimensions", shape_string(bias)));
    sizes.insert(sizes.begin(), 4 - sizes.size(), 1);
    if ((sizes[0] != 1 && sizes[0] != batch) || sizes[1] != 1 || sizes[2] != 1 ||
        (sizes[3] != 1 && sizes[3] != keys)) {
        bad(fmt::format("bias {} does not broadcast to [{}, 1, 1, {}] (a per-key mask)",
                        shape_string(bias), batch, keys));
    }
    return bias.view(sizes);
}

struct ChunkedAttentionFunction : torch::autograd::Function<ChunkedAttentionFunction> {
    // `bias` is an optional: the Function's input bookkeeping refuses undefined tensors.
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const c10::optional<at::Tensor>& bias_arg,
                              int64_t chunk) {
        NoAutocast no_autocast;
        const at::Tensor bias = bias_arg.value_or(at::Tensor());
        const int64_t rows = q.size(2);
        const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
        const at::Tensor kt = k.to(at::kFloat).transpose(-2, -1);  // [B, H, d, L]
        const at::Tensor vf = v.to(at::kFloat);                    // [B, H, L, dv]
        const at::Tensor bf = bias.defined() ? bias.to(at::kFloat) : at::Tensor();
        at::Tensor out = at::empty({q.size(0), q.size(1), rows, v.size(3)}, q.options());
        at::Tensor lse = at::empty({q.size(0), q.size(1), rows}, q.options().dtype(at::kFloat));
        for (int64_t start = 0; start < rows; start += chunk) {
            const int64_t n = std::min(chunk, rows - start);
            at::Tensor s = at::matmul(q.narrow(2, start, n).to(at::kFloat) * scale, kt);
            if (bf.defined()) s.add_(bf);                                       // [B, H, n, L]
            const at::Tensor row_lse = at::logsumexp(s, -1, /*keepdim=*/true);  // [B, H, n, 1]
            s.sub_(row_lse).exp_();                                             // probabilities
            out.narrow(2, start, n).copy_(at::matmul(s, vf));                   // [B, H, n, dv]
            lse.narrow(2, start, n).copy_(row_lse.squeeze(-1));
        }
        ctx->save_for_backward({q, k, v, bias, out, lse});
        ctx->saved_data["chunk"] = chunk;
        return out;
    }

    // One slot per forward argument: q, k, v, bias, chunk.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        NoAutocast no_autocast;
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &bias = saved[3];
        const at::Tensor &out = saved[4], &lse = saved[5];
        const int64_t chunk = ctx->saved_data.at("chunk").toInt();
        const at::Tensor& grad_out = grad_outputs.at(0);  // [B, H, N, dv]
        const bool want_q = ctx->needs_input_grad(0), want_k = ctx->needs_input_grad(1);
        const bool want_v = ctx->needs_input_grad(2);
        const bool want_bias = bias.defined() && ctx->needs_input_grad(3);

        const int64_t rows = q.size(2);
        const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
        const at::Tensor kf = k.to(at::kFloat);  // [B, H, L, d]
        const at::Tensor vf = v.to(at::kFloat);  // [B, H, L, dv]
        const at::Tensor bf = bias.defined() ? bias.to(at::kFloat) : at::Tensor();
        at::Tensor dq = want_q ? at::empty_like(q) : at::Tensor();
        at::Tensor dk = want_k ? at::zeros_like(kf) : at::Tensor();
        at::Tensor dv = want_v ? at::zeros_like(vf) : at::Tensor();
        at::Tensor dbias;
        if (want_bias) dbias = at::zeros({q.size(0), 1, 1, k.size(2)}, kf.options());
        for (int64_t start = 0; start < rows; start += chunk) {
            const int64_t n = std::min(chunk, rows - start);
            const at::Tensor qs = q.narrow(2, start, n).to(at::kFloat) * scale;  // [B, H, n, d]
            at::Tensor p = at::matmul(qs, kf.transpose(-2, -1));                 // [B, H, n, L]
            if (bf.defined()) p.add_(bf);
            p.sub_(lse.narrow(2, start, n).unsqueeze(-1)).exp_();
            const at::Tensor dout = grad_out.narrow(2, start, n).to(at::kFloat);  // [B, H, n, dv]
            if (want_v) dv.add_(at::matmul(p.transpose(-2, -1), dout));           // [B, H, L, dv]
            if (!want_q && !want_k && !want_bias) continue;
            // rowsum(dO * O) = rowsum(dO * (P V)) = rowsum(P * dP): the softmax's correction.
            const at::Tensor correction =
                (dout * out.narrow(2, start, n).to(at::kFloat)).sum(-1, /*keepdim=*/true);
            at::Tensor ds = at::matmul(dout, vf.transpose(-2, -1));  // dP: [B, H, n, L]
            ds.sub_(correction).mul_(p);                             // dS = P * (dP - rowsum)
            p.reset();
            if (want_bias) dbias.add_(ds.sum({1, 2}, /*keepdim=*/true));  // [B, 1, 1, L]
            if (want_q) dq.narrow(2, start, n).copy_(at::matmul(ds, kf) * scale);
            if (want_k) dk.add_(at::matmul(ds.transpose(-2, -1), qs));  // [B, H, L, d]
        }
        if (want_k) dk = dk.to(k.scalar_type());
        if (want_v) dv = dv.to(v.scalar_type());
        if (want_bias) dbias = dbias.sum_to_size(bias.sizes()).to(bias.scalar_type());
        return {dq, dk, dv, dbias, at::Tensor()};
    }
};

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
    switch (kernel) {
        case AttentionKernel::kDense:
            return "dense";
        case AttentionKernel::kChunked:
            return "chunked";
        case AttentionKernel::kFused:
            return "fused";
    }
    return "unknown";
}

at::Tensor chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& bias, int64_t chunk) {
    if (chunk < 1) bad(fmt::format("chunk must be at least 1, got {}", chunk));
    const at::Tensor bias4 = checked_bias(q, k, v, bias);
    return ChunkedAttentionFunction::apply(
        q, k, v, bias4.defined() ? c10::optional<at::Tensor>(bias4) : c10::nullopt, chunk);
}

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& bias) {
    // The same ops, in the same order, as compat::scaled_dot_product_attention's 1.13 form, so
    // the numbers the golden tests pin do not move.
    const at::Tensor mask = bias.defined() ? bias.to(q.scalar_type()) : at::Tensor();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    at::Tensor scores = at::matmul(q * scale, k.transpose(-2, -1));  // [B, H, N, L]
    if (mask.defined()) scores = scores + mask;
    return at::matmul(at::softmax(scores, -1), v);  // [B, H, N, d]
}

at::Tensor attention(AttentionKernel kernel, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& bias, int64_t chunk) {
    switch (kernel) {
        case AttentionKernel::kDense:
            return dense_attention(q, k, v, bias);
        case AttentionKernel::kChunked:
            return chunked_attention(q, k, v, bias, chunk);
        case AttentionKernel::kFused:
            if constexpr (compat::kHasFusedAttention) {
                return compat::scaled_dot_product_attention(q, k, v, bias);
            } else {
                return chunked_attention(q, k, v, bias, chunk);
            }
    }
    throw Error::InvalidArgument("attention: unknown kernel");
}

}  // namespace sf::model
