// The ReLU linear attention of Sana's self-attention (SanaLinearAttnProcessor2_0) as one
// memory-saving kernel, for sequences too long to hold its fp32 intermediates whole:
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

}  // namespace sf::model
