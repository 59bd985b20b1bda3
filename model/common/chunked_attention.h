// Softmax attention kernels for the cross-attention of image tokens (N, up to 16K at 4K px) to
// caption tokens (L, up to 300):
//
//   kDense    softmax(q k^T / sqrt(d) + bias) v in plain ops, as the unoptimised Python scripts
//             do; autograd keeps the [B, H, N, L] probabilities (and the scores) for backward.
//   kChunked  chunked_attention(): exact, over chunks of query rows; keeps only q, k, v, the
//             output and one log-sum-exp per row, and its backward recomputes each chunk's
//             probabilities, so memory grows linearly in N with a small constant.
//   kFused    ATen's scaled_dot_product_attention (flash / memory-efficient kernels) on
//             LibTorch 2.0 and later; LibTorch 1.13 has none, so there it is kChunked.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace sf::model {

enum class AttentionKernel { kDense, kChunked, kFused };

// "dense", "chunked", "fused".
const char* attention_kernel_name(AttentionKernel kernel);

// softmax(q k^T / sqrt(d) + bias) v for q [B, H, N, d], k and v [B, H, L, d] and `bias` an
// additive per-key mask broadcastable to [B, 1, 1, L] (0 keeps, -10000 drops), or undefined.
// Computed `chunk` query rows at a time; the math is fp32 whatever the input dtype (fp16, bf16),
// and the output has q's dtype. Differentiable in q, k, v (and bias, when it requires grad).
// Bad shapes or chunk < 1 are sf::Error kInvalidArgument.
at::Tensor chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& bias, int64_t chunk);

// The kDense form: bias cast to q's dtype, scores, softmax, product, in q's dtype.
at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& bias);

// Dispatches to the kernel; `chunk` is used by kChunked (and by kFused where it falls back).
at::Tensor attention(AttentionKernel kernel, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& bias, int64_t chunk);

}  // namespace sf::model
