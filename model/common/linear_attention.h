// The ReLU linear attentions of Sana's self-attention (SanaLinearAttnProcessor2_0) and of
// SANA-Video's (SanaLinearAttnProcessor3_0, with rotary positions), each as one memory-saving
// kernel, for sequences too long to hold their fp32 intermediates whole. The image one:
//
//   per head, out = (v_pad relu(k)^T) relu(q), v_pad = v with a row of ones appended, and the
//   output's first d rows divided by its last (the softmax-free normaliser) plus 1e-15.
//
// q, k, v are the projections, [B, N, H * d], channel c = head * d + i. The kernel runs over
// `chunk` tokens at a time in fp32 whatever their dtype: kv = sum over chunks of v_pad relu(k)^T
// ([B, H, d + 1, d]), then each chunk's output from kv. Backward keeps only q, k, v (in their
// own dtype) and kv, and recomputes each chunk's fp32 values from them, so neither the fp32
// copies of the whole sequence nor a recompute of the projections are needed. The result equals
// the plain ops' (SanaLinearAttentionImpl with chunk_tokens 0) up to the order of kv's sum.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace sf::model {

// [B, N, H * d] q, k, v -> [B, N, H * d] in q's dtype. Differentiable in q, k and v. Mismatched
// shapes, a width that `heads` does not divide, or chunk < 1 are sf::Error kInvalidArgument.
at::Tensor relu_linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t heads, int64_t chunk);

// The video one: per head, with Q = relu(q), K = relu(k) and rot() the rotary positions (each
// channel pair (2i, 2i + 1) of token n turned by the angle whose cosine and sine are cos[n, i] and
// sin[n, i]),
//
//   out_n = (sum_j V_j rot(K_j)^T) rot(Q_n) / (sum_j K_j . Q_n + 1e-15)
//
// kv ([B, H, d, d]) and K's column sums are summed over chunks of `chunk` tokens, then each
// chunk's output is computed from them, all in fp32. Backward keeps q, k, v (in their own
// dtypes), the tables and those sums, and recomputes each chunk's relu and rotations. The plain
// ops (SanaVideoLinearAttentionImpl with chunk_tokens 0) compute the normaliser in the input dtype
// as upstream does; in fp32 the two agree up to the order of the sums.
//
// q, k, v [B, N, H * d] (any floating dtypes), cos and sin [N, d / 2] fp32 -> [B, N, H * d] in
// q's dtype. Differentiable in q, k and v. Mismatched shapes or devices, an odd head width, a
// width that `heads` does not divide, or chunk < 1 are sf::Error kInvalidArgument.
at::Tensor rotary_relu_linear_attention(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& cos,
                                        const at::Tensor& sin, int64_t heads, int64_t chunk);

}  // namespace sf::model
