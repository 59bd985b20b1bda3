// The parts of diffusers' SanaVideoTransformer3DModel (v0.36.0) that the image transformer does
// not have, registered under upstream's module names: the 3-axis rotary positions
// (WanRotaryPosEmbed), the ReLU linear self-attention with q/k RMSNorm and rotary positions
// (SanaLinearAttnProcessor3_0), the feed-forward with a temporal convolution (GLUMBTempConv),
// the guidance embedder and the block that holds them. The timestep and caption embedders and the
// cross-attention are the image model's (model/sana/sana_blocks.h).
//
// Tokens are [B, N, D] with N = f * h * w patches, frame-major, then row, then column (the patch
// conv's flatten order). Modulation comes per group of tokens: [B, G, 6D] with G = 1 (one
// timestep per sample), f (one per latent frame) or N (one per token, upstream's form); group g
// holds tokens [g N / G, (g + 1) N / G).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <utility>

#include "model/sana/sana_blocks.h"
#include "model/sana_video/sana_video_config.h"

namespace sf::model {

// The patch grid of a video latent: frames x rows x columns of patches.
struct VideoGrid {
    int64_t frames = 0, height = 0, width = 0;
    int64_t tokens() const { return frames * height * width; }
};

// WanRotaryPosEmbed for one grid (diffusers v0.36.0): {cos, sin}, each [N, head_dim / 2]
// float32, the angle of every channel pair of every token. The head's channels are split into
// time, height and width parts of t = head_dim - 2 * (head_dim / 6) and 2 * (head_dim / 6) each
// (8/4/4 for 16, 40/36/36 for SANA-Video's 112), turned by the token's frame, row and column.
// (Later diffusers revisions look the tables up with a head_dim / 3 split instead, which differs
// from this for head dims that are not multiples of 6; v0.36.0 is what the golden data pins.)
// The grid must fit upstream's tables (rope_max_seq_len rows): the caller checks.
std::pair<at::Tensor, at::Tensor> sana_video_rotary(int64_t head_dim, const VideoGrid& grid,
                                                    const at::Device& device);

// Rotates the channel pairs of x [B, N, H, d] by {cos, sin} [N, d / 2]; the result has x's dtype.
at::Tensor apply_video_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// SanaLinearAttnProcessor3_0: q, k (RMSNorm over all heads when configured), ReLU, then rotary
// positions on q and k. Per head out = (v k_rot^T) q_rot / (sum_j k_j . q + 1e-15): the numerator
// in fp32, the normaliser from the un-rotated q and k in the input dtype, as upstream.
//
// With chunk_tokens n > 0 (the chunked and fused attention kinds) the attention after the
// projections and norms is one kernel over n tokens at a time (rotary_relu_linear_attention,
// model/common/linear_attention.h): backward keeps q, k and v only, not their ReLUs, rotations
// and fp32 copies, and the normaliser is fp32 too. The result is the plain ops' up to rounding.
struct SanaVideoLinearAttentionImpl : torch::nn::Module {
    SanaVideoLinearAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool bias,
                                 bool qk_norm, double dropout);
    // x [B, N, D], cos and sin [N, d / 2] -> [B, N, D]
    at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
    torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
    SanaRMSNorm norm_q{nullptr}, norm_k{nullptr};  // null without qk_norm
    torch::nn::ModuleList to_out{nullptr};
    torch::nn::Linear out_proj{nullptr};      // to_out[0]
    torch::nn::Dropout out_dropout{nullptr};  // to_out[1]
    int64_t heads;
    int64_t chunk_tokens = 0;  // 0: the plain ops over every token at once
};
TORCH_MODULE(SanaVideoLinearAttention);

// GLUMBTempConv without its residual and norm (as the block builds it): per frame a 1x1 conv to
// 2F + SiLU, a 3x3 depthwise conv, value x SiLU(gate), a 1x1 conv back to D (no bias); then
// x + conv_temp(x), a 3-tap convolution over frames (no bias).
//
// With chunk_frames k > 0 the per-frame part runs k frames at a time, each chunk checkpointed in
// grad mode (model/common/checkpoint.h): the 6D-wide hidden activations exist for k frames at
// once, in the forward and again in the backward, and none is kept between them. The temporal
// convolution then runs on the D-wide result of every frame, so no chunk needs a halo of
// neighbouring frames. The result and the gradients are those of the whole window.
struct SanaVideoFeedForwardImpl : torch::nn::Module {
    SanaVideoFeedForwardImpl(int64_t dim, int64_t hidden);
    at::Tensor forward(const at::Tensor& x, const VideoGrid& grid);  // [B, N, D] -> [B, N, D]
    // [B * f, D, h, w] -> [B * f, D, h, w]: the convolutions inside each frame.
    at::Tensor per_frame(const at::Tensor& frames);
    torch::nn::Conv2d conv_inverted{nullptr}, conv_depth{nullptr}, conv_point{nullptr};
    torch::nn::Conv2d conv_temp{nullptr};
    int64_t chunk_frames = 0;  // 0: the whole window at once
};
TORCH_MODULE(SanaVideoFeedForward);

// SanaCombinedTimestepGuidanceEmbeddings ("time_embed" with guidance_embeds): the timestep and
// the guidance value embedded alike and summed; SiLU and `linear` make the 6D modulation.
struct SanaVideoGuidanceEmbeddingImpl : torch::nn::Module {
    explicit SanaVideoGuidanceEmbeddingImpl(int64_t dim);
    // timestep and guidance [M] -> {modulation [M, 6D], embedded [M, D]}, in `dtype`.
    std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& timestep,
                                              const at::Tensor& guidance, at::ScalarType dtype);
    SanaTimestepEmbedding timestep_embedder{nullptr}, guidance_embedder{nullptr};
    torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(SanaVideoGuidanceEmbedding);

// x [B, N, D] * (1 + scale) + shift with scale and shift [B, G, D] per group of tokens.
at::Tensor modulate_groups(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);
// x [B, N, D] * gate with gate [B, G, D].
at::Tensor gate_groups(const at::Tensor& x, const at::Tensor& gate);

// One block: modulated linear self-attention with rotary positions, unmodulated and ungated
// cross-attention to the caption, modulated GLUMBTempConv.
struct SanaVideoTransformerBlockImpl : torch::nn::Module {
    explicit SanaVideoTransformerBlockImpl(const SanaVideoTransformerConfig& config);
    // tokens [B, N, D]; context [B, L, D]; bias [B, 1, 1, L] or undefined; modulation [B, G, 6D];
    // cos and sin [N, d / 2] -> [B, N, D]
    at::Tensor forward(const at::Tensor& tokens, const at::Tensor& context, const at::Tensor& bias,
                       const at::Tensor& modulation, const at::Tensor& cos, const at::Tensor& sin,
                       const VideoGrid& grid);
    at::Tensor scale_shift_table;  // [6, D]: shift, scale, gate for attention, then for the FFN
    torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
    SanaVideoLinearAttention attn1{nullptr};
    SanaCrossAttention attn2{nullptr};
    SanaVideoFeedForward ff{nullptr};
};
TORCH_MODULE(SanaVideoTransformerBlock);

}  // namespace sf::model
