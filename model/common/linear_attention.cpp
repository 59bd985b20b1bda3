// The image kernel, per head and chunk, in the tokens' own layout (no transposing copies): with
// Q = relu(q), K = relu(k), V [n, d] and V_pad = [V, 1] [n, d + 1],
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
#include <string>
#include <utility>
#include <vector>

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

// The chunks of `tokens` tokens: (start, count) pairs of `chunk` tokens, the last one shorter.
std::vector<std::pair<int64_t, int64_t>> token_chunks(int64_t tokens, int64_t chunk) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t start = 0; start < tokens; start += chunk)
        out.emplace_back(start, std::min(chunk, tokens - start));
    return out;
}

// What both kernels' backward reads besides the saved tensors.
struct Call {
    int64_t heads = 0, chunk = 0;
    bool want_q = false, want_k = false, want_v = false;  // q, k, v are inputs 0, 1, 2
};
void save_call(AutogradContext* ctx, int64_t heads, int64_t chunk) {
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["chunk"] = chunk;
}
Call saved_call(AutogradContext* ctx) {
    return {ctx->saved_data.at("heads").toInt(), ctx->saved_data.at("chunk").toInt(),
            ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
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
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            kvt.add_(keys_values(at::relu(heads_fp32(k, start, n, heads)),
                                 heads_fp32(v, start, n, heads)));
        }
        at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            const at::Tensor o = at::matmul(at::relu(heads_fp32(q, start, n, heads)), kvt);
            heads_of(out, start, n, heads).copy_(o.narrow(3, 0, d) / (o.narrow(3, d, 1) + 1e-15));
        }
        ctx->save_for_backward({q, k, v, kvt});
        save_call(ctx, heads, chunk);
        return out;
    }

    // One slot per forward argument: q, k, v, heads, chunk.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        NoAutocast no_autocast;
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &kvt = saved[3];
        const auto [heads, chunk, want_q, want_k, want_v] = saved_call(ctx);
        const at::Tensor& grad_out = grad_outputs.at(0);  // [B, N, H * d]
        const int64_t tokens = q.size(1), d = kvt.size(2);

        at::Tensor dq = want_q ? at::empty_like(q, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dkvt = at::zeros_like(kvt);  // [B, H, d, d + 1]
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
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
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
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

// The rotary positions of tokens [start, start + n) on x [B, H, n, d] (fp32): each channel pair
// turned by the table's angle, or back (the transpose) with `back`.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t start,
                  bool back = false) {
    const int64_t n = x.size(2);
    const at::Tensor c = cos.narrow(0, start, n), s = sin.narrow(0, start, n);  // [n, d / 2]
    const at::Tensor pairs = x.unflatten(-1, {-1, 2});
    const at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    const at::Tensor even = back ? x1 * c + x2 * s : x1 * c - x2 * s;
    const at::Tensor odd = back ? x2 * c - x1 * s : x1 * s + x2 * c;
    return at::stack({even, odd}, -1).flatten(-2);
}

// Per head and chunk of n tokens (fp32, [B, H, n, d]), with Q = relu(q), K = relu(k),
// Qr = rot(Q), Kr = rot(K):
//   forward    kvT = sum Kr^T V ([d, d]), ksum = sum K ([d]);
//              O = Qr kvT, r = 1 / (Q ksum + 1e-15) ([n, 1]), out = O r
//   backward   dO = G r, dr = sum_j (G O)_j, ds = -dr r^2;
//              dkvT = sum Qr^T dO, dksum = sum Q^T ds, dQ = rot^T(dO kvT^T) + ds ksum^T;
//              dV = Kr dkvT, dK = rot^T(V dkvT^T) + dksum (each row); the ReLUs pass dQ, dK
//              where q, k > 0.
struct RotaryReluLinearAttentionFunction
    : torch::autograd::Function<RotaryReluLinearAttentionFunction> {
    static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin,
                              int64_t heads, int64_t chunk) {
        NoAutocast no_autocast;
        const int64_t batch = q.size(0), tokens = q.size(1), d = q.size(2) / heads;
        const auto f32 = q.options().dtype(at::kFloat);
        at::Tensor kvt = at::zeros({batch, heads, d, d}, f32);
        at::Tensor ksum = at::zeros({batch, heads, d, 1}, f32);
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            const at::Tensor keys = at::relu(heads_fp32(k, start, n, heads));
            kvt.add_(at::matmul(rotate(keys, cos, sin, start).transpose(2, 3),
                                heads_fp32(v, start, n, heads)));
            ksum.add_(keys.sum(2).unsqueeze(3));
        }
        at::Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            const at::Tensor queries = at::relu(heads_fp32(q, start, n, heads));
            const at::Tensor o = at::matmul(rotate(queries, cos, sin, start), kvt);
            const at::Tensor r = at::reciprocal(at::matmul(queries, ksum) + 1e-15);  // [.., n, 1]
            heads_of(out, start, n, heads).copy_(o * r);
        }
        ctx->save_for_backward({q, k, v, cos, sin, kvt, ksum});
        save_call(ctx, heads, chunk);
        return out;
    }

    // One slot per forward argument: q, k, v, cos, sin, heads, chunk.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        NoAutocast no_autocast;
        const variable_list saved = ctx->get_saved_variables();
        const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
        const at::Tensor &cos = saved[3], &sin = saved[4], &kvt = saved[5], &ksum = saved[6];
        const auto [heads, chunk, want_q, want_k, want_v] = saved_call(ctx);
        const at::Tensor& grad_out = grad_outputs.at(0);  // [B, N, H * d]
        const int64_t tokens = q.size(1);
        const variable_list none(4);  // cos, sin, heads, chunk

        at::Tensor dq = want_q ? at::empty_like(q, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dkvt = at::zeros_like(kvt), dksum = at::zeros_like(ksum);
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            const at::Tensor q_pre = heads_fp32(q, start, n, heads);  // [B, H, n, d]
            const at::Tensor queries = at::relu(q_pre);
            const at::Tensor rotated = rotate(queries, cos, sin, start);
            const at::Tensor o = at::matmul(rotated, kvt);
            const at::Tensor r = at::reciprocal(at::matmul(queries, ksum) + 1e-15);
            const at::Tensor g = heads_fp32(grad_out, start, n, heads);
            const at::Tensor d_o = g * r;
            const at::Tensor d_s = (g * o).sum(3, /*keepdim=*/true).mul_(r).mul_(r).neg_();
            dkvt.add_(at::matmul(rotated.transpose(2, 3), d_o));
            dksum.add_(at::matmul(queries.transpose(2, 3), d_s));
            if (want_q) {
                at::Tensor d_q = rotate(at::matmul(d_o, kvt.transpose(2, 3)), cos, sin, start,
                                        /*back=*/true);
                d_q.add_(d_s * ksum.transpose(2, 3));
                heads_of(dq, start, n, heads).copy_(at::threshold_backward(d_q, q_pre, 0));
            }
        }
        at::Tensor dk = want_k ? at::empty_like(k, at::MemoryFormat::Contiguous) : at::Tensor();
        at::Tensor dv = want_v ? at::empty_like(v, at::MemoryFormat::Contiguous) : at::Tensor();
        if (!want_k && !want_v) return {dq, dk, dv, none[0], none[1], none[2], none[3]};
        for (const auto& [start, n] : token_chunks(tokens, chunk)) {
            const at::Tensor k_pre = heads_fp32(k, start, n, heads);  // [B, H, n, d]
            const at::Tensor keys = at::relu(k_pre);
            if (want_v) {
                heads_of(dv, start, n, heads)
                    .copy_(at::matmul(rotate(keys, cos, sin, start), dkvt));
            }
            if (want_k) {
                at::Tensor d_k =
                    rotate(at::matmul(heads_fp32(v, start, n, heads), dkvt.transpose(2, 3)), cos,
                           sin, start, /*back=*/true);
                d_k.add_(dksum.transpose(2, 3));
                heads_of(dk, start, n, heads).copy_(at::threshold_backward(d_k, k_pre, 0));
            }
        }
        return {dq, dk, dv, none[0], none[1], none[2], none[3]};
    }
};

}  // namespace

namespace {

// What both kernels require of q, k, v, heads and chunk; kInvalidArgument naming `kernel`.
void check_call(const char* kernel, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                int64_t heads, int64_t chunk) {
    const auto shape = [](const at::Tensor& t) {
        return t.defined() ? shape_string(t) : std::string("undefined");
    };
    std::string bad;
    if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 3 ||
        !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
        bad = fmt::format("q, k, v must be [B, N, H * d] alike; got {}, {}, {}", shape(q), shape(k),
                          shape(v));
    } else if (heads < 1 || q.size(2) % heads != 0) {
        bad = fmt::format("{} heads do not divide the width {}", heads, q.size(2));
    } else if (chunk < 1) {
        bad = fmt::format("chunk must be at least 1, got {}", chunk);
    }
    if (!bad.empty()) throw Error::InvalidArgument(fmt::format("{}: {}", kernel, bad));
}

}  // namespace

at::Tensor relu_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t heads, int64_t chunk) {
    check_call("relu_linear_attention", q, k, v, heads, chunk);
    const auto bad = [](const std::string& what) {
        throw Error::InvalidArgument("relu_linear_attention: " + what);
    };
    if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() ||
        k.device() != q.device() || v.device() != q.device()) {
        bad("q, k and v must share dtype and device");
    }
    return ReluLinearAttentionFunction::apply(q, k, v, heads, chunk);
}

at::Tensor rotary_relu_linear_attention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& cos,
                                        const at::Tensor& sin, int64_t heads, int64_t chunk) {
    check_call("rotary_relu_linear_attention", q, k, v, heads, chunk);
    const auto bad = [](const std::string& what) {
        throw Error::InvalidArgument("rotary_relu_linear_attention: " + what);
    };
    if ((q.size(2) / heads) % 2 != 0) {
        bad(
            fmt::format("heads of {} channels: rotary positions turn pairs, so the width must be "
                        "even",
                        q.size(2) / heads));
    }
    const std::vector<int64_t> table = {q.size(1), q.size(2) / heads / 2};
    if (!cos.defined() || !sin.defined() || !cos.sizes().equals(table) ||
        !sin.sizes().equals(table) || cos.scalar_type() != at::kFloat ||
        sin.scalar_type() != at::kFloat) {
        bad(fmt::format("cos and sin must be fp32 [{}, {}] (tokens, head width / 2); got {}, {}",
                        table[0], table[1], cos.defined() ? shape_string(cos) : "undefined",
                        sin.defined() ? shape_string(sin) : "undefined"));
    }
    for (const at::Tensor* t : {&k, &v, &cos, &sin}) {
        if (t->device() != q.device()) bad("q, k, v, cos and sin must share a device");
    }
    if (!q.is_floating_point() || !k.is_floating_point() || !v.is_floating_point()) {
        bad("q, k and v must be floating point");
    }
    return RotaryReluLinearAttentionFunction::apply(q, k, v, cos, sin, heads, chunk);
}

}  // namespace sf::model
