// The parts of diffusers' SanaTransformer2DModel (v0.33.1), each registered under upstream's
// module names so that their parameters carry the state-dict keys of a diffusers checkpoint:
// embeddings (timestep, caption, patches), the linear self-attention, the cross-attention to the
// caption, the Mix-FFN (GLUMBConv) and the transformer block that holds them.
//
// Tokens are [B, N, D] with N = h * w patches in row-major order; captions are [B, L, D] after
// projection; a caption bias is [B, 1, 1, L], 0 for tokens and -10000 for padding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "model/common/chunked_attention.h"
#include "model/sana/sana_config.h"

namespace sf::model {

// diffusers' get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0):
// [B] -> [B, dim] float32, the cosine half first.
at::Tensor sana_timestep_features(const at::Tensor& timestep, int64_t dim);

// diffusers' get_2d_sincos_pos_embed for a grid of `height` x `width` patches: [h * w, dim]
// float32, the first half encoding the column, the second the row. Positions are scaled by
// base_size / height (base_size / width) and divided by interpolation_scale, so a larger grid
// keeps the frequencies the model was trained on.
at::Tensor sana_sincos_pos_embed(int64_t dim, int64_t height, int64_t width, int64_t base_size,
                                 double interpolation_scale, const at::Device& device);

// Upstream's attention output, to_out = [Linear(in, out), Dropout]: the ModuleList names them "0"
// and "1"; `proj` and `drop` are set to its two modules.
torch::nn::ModuleList make_attention_output(int64_t in, int64_t out, double dropout,
                                            torch::nn::Linear& proj, torch::nn::Dropout& drop);

// TimestepEmbedding: linear_1 -> SiLU -> linear_2.
struct SanaTimestepEmbeddingImpl : torch::nn::Module {
    SanaTimestepEmbeddingImpl(int64_t in_features, int64_t dim);
    at::Tensor forward(const at::Tensor& x);
    torch::nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(SanaTimestepEmbedding);

// AdaLayerNormSingle ("time_embed"): emb.timestep_embedder embeds the sinusoidal features; SiLU
// and `linear` make the 6 * D modulation that every block adds to its scale_shift_table.
struct SanaAdaLayerNormSingleImpl : torch::nn::Module {
    explicit SanaAdaLayerNormSingleImpl(int64_t dim);
    // [B] -> {modulation [B, 6D], embedded timestep [B, D]}, in `dtype`.
    std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& timestep, at::ScalarType dtype);
    // Upstream nests the embedder in PixArtAlphaCombinedTimestepSizeEmbeddings ("emb").
    std::shared_ptr<torch::nn::Module> emb;
    SanaTimestepEmbedding timestep_embedder{nullptr};
    torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(SanaAdaLayerNormSingle);

// PixArtAlphaTextProjection: linear_1 -> GELU(tanh) -> linear_2.
struct SanaCaptionProjectionImpl : torch::nn::Module {
    SanaCaptionProjectionImpl(int64_t in_features, int64_t dim);
    at::Tensor forward(const at::Tensor& x);
    torch::nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(SanaCaptionProjection);

// diffusers' RMSNorm with a weight: the mean square is taken in fp32; x * rsqrt(ms + eps) * w.
// One autograd node that keeps x (in its own dtype) and the per-row rsqrt for backward, not the
// fp32 copies the plain ops keep; the values are upstream's operation by operation.
struct SanaRMSNormImpl : torch::nn::Module {
    SanaRMSNormImpl(int64_t dim, double eps);
    at::Tensor forward(const at::Tensor& x);
    at::Tensor weight;
    double eps;
};
TORCH_MODULE(SanaRMSNorm);

// PatchEmbed: a p x p conv with stride p ("proj"), flattened to tokens, plus the sin-cos
// position embedding when interpolation_scale is set. Upstream keeps that embedding in a
// non-persistent buffer (not in checkpoints), so here it is computed, not registered.
struct SanaPatchEmbedImpl : torch::nn::Module {
    SanaPatchEmbedImpl(int64_t in_channels, int64_t dim, int64_t patch_size, int64_t sample_size,
                       std::optional<double> interpolation_scale);
    // [B, C, H, W] -> [B, (H / p) * (W / p), D]
    at::Tensor forward(const at::Tensor& x);
    torch::nn::Conv2d proj{nullptr};
    int64_t patch_size, base_size;
    std::optional<double> interpolation_scale;
};
TORCH_MODULE(SanaPatchEmbed);

// Self-attention with a ReLU kernel, linear in the number of tokens (SanaLinearAttnProcessor2_0):
// per head, out = (v_pad k^T) q with v padded by a row of ones, whose last row is the normaliser;
// computed in fp32 whatever the input dtype. `to_out` is a ModuleList as upstream: "0" the
// output Linear, "1" a Dropout (no parameters).
//
// With chunk_tokens n > 0 (the chunked and fused attention kinds) the attention between the
// projections is relu_linear_attention() (model/common/linear_attention.h), over n tokens at a
// time: it keeps q, k, v in their own dtype and the small kv ([B, H, d + 1, d]), so the fp32 q, k,
// v of the whole sequence never exist at once and nothing is recomputed; the result equals the
// whole run's up to the order of kv's sum.
struct SanaLinearAttentionImpl : torch::nn::Module {
    SanaLinearAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, bool bias,
                            double dropout);
    at::Tensor forward(const at::Tensor& x);  // [B, N, D] -> [B, N, D]
    // x [B, n, D] -> its part of kv: [B, H, d + 1, d], fp32.
    at::Tensor key_values(const at::Tensor& x);
    // x [B, n, D] and kv of the whole sequence -> the output of x's tokens [B, n, D].
    at::Tensor attend(const at::Tensor& x, const at::Tensor& kv);
    int64_t chunk_tokens = 0;  // 0: every token at once
    torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
    torch::nn::ModuleList to_out{nullptr};
    torch::nn::Linear out_proj{nullptr};      // to_out[0]
    torch::nn::Dropout out_dropout{nullptr};  // to_out[1]
    int64_t heads;
};
TORCH_MODULE(SanaLinearAttention);

// Softmax cross-attention from the image tokens to the caption tokens, every projection with a
// bias. The attention itself is one function, attend(), running the kernel this module is set
// to (SanaTransformerImpl::set_attention): dense by default, chunked or fused to save memory.
// With `qk_norm` (SANA-Video's "rms_norm_across_heads") q and k get an RMSNorm over all heads
// (norm_q, norm_k, eps 1e-5) before the heads are split.
struct SanaCrossAttentionImpl : torch::nn::Module {
    SanaCrossAttentionImpl(int64_t dim, int64_t context_dim, int64_t heads, int64_t head_dim,
                           double dropout, bool qk_norm = false);
    // x [B, N, D], context [B, L, context_dim], bias [B, 1, 1, L] or undefined -> [B, N, D]
    at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& bias);
    // q [B, H, N, d], k and v [B, H, L, d] -> [B, H, N, d]
    at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& bias) const;
    torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
    SanaRMSNorm norm_q{nullptr}, norm_k{nullptr};  // null without qk_norm
    torch::nn::ModuleList to_out{nullptr};
    torch::nn::Linear out_proj{nullptr};      // to_out[0]
    torch::nn::Dropout out_dropout{nullptr};  // to_out[1]
    int64_t heads, head_dim;
    AttentionKernel attention_kernel = AttentionKernel::kDense;
    int64_t attention_chunk = 1024;  // query rows per chunk for kChunked (and kFused on 1.13)
};
TORCH_MODULE(SanaCrossAttention);

// The Mix-FFN's weights as one call uses them: the modules' own, or each cast once to the dtype
// autocast would cast it to, so that a chunked call does not cast them again for every chunk.
struct MixFFNWeights {
    at::Tensor inverted, inverted_bias, depth, depth_bias, point;
    // The five in this order, for matching a parameter to its stand-in.
    std::array<at::Tensor*, 5> all() {
        return {&inverted, &inverted_bias, &depth, &depth_bias, &point};
    }
};

// Mix-FFN: 1x1 conv to 2h + SiLU, 3x3 depthwise conv, x * SiLU(gate), 1x1 conv back to D (no
// bias). The depthwise conv is what gives linear attention its sense of locality.
//
// With chunk_rows k > 0 it runs over k rows of the latent at a time: the 2h-wide hidden
// activations exist for k rows at once, in the forward and again in the backward, which
// recomputes each chunk (as gradient checkpointing would, in one autograd node for all chunks)
// and keeps none between them. The 3x3 conv of rows
// [r, r + k) reads rows r - 1 and r + k, so each chunk takes them as a halo and drops their
// output (k + 2 rows computed for k); at the image's edge the conv's zero padding stands in for
// them as in the whole run. The result and the gradients are those of the unchunked run.
struct SanaGLUMBConvImpl : torch::nn::Module {
    SanaGLUMBConvImpl(int64_t dim, int64_t hidden);
    // The block's gated residual h + gate * ff(x): h [B, h * w, D], gate [B, 1, D], x
    // [B, D, h, w] -> [B, h * w, D]. The gate is inside so that a chunked backward needs no
    // value of ff(x): with `result_unread` (the caller uses the result's gradient graph only, as
    // a checkpoint's recompute does) the chunked forward in grad mode computes nothing.
    at::Tensor gated_residual(const at::Tensor& h, const at::Tensor& gate, const at::Tensor& x,
                              bool result_unread = false);
    // The same by chunks of rows, without grad.
    at::Tensor chunked_gated_residual(const at::Tensor& h, const at::Tensor& gate,
                                      const at::Tensor& x);
    // `count` rows of ff from `window` [B, D, rows, w], rows of x whose first `first` (and any
    // after the `count`) are halo: -> [B, D, count, w].
    at::Tensor rows(const at::Tensor& window, int64_t first, int64_t count, const MixFFNWeights& w);
    // The modules' weights as they are.
    MixFFNWeights weights() const;
    // Detached copies cast to what autocast (the calling thread's) would cast them to for
    // tensors on their device; those whose parameter requires grad require grad themselves
    // (autograd::grad's targets in the chunked backward).
    MixFFNWeights cast_weights() const;
    torch::nn::Conv2d conv_inverted{nullptr}, conv_depth{nullptr}, conv_point{nullptr};
    int64_t chunk_rows = 0;  // 0: every row at once
};
TORCH_MODULE(SanaGLUMBConv);

// One block: AdaLN-single modulated linear self-attention, unmodulated cross-attention to the
// caption, modulated Mix-FFN on the token grid.
struct SanaTransformerBlockImpl : torch::nn::Module {
    explicit SanaTransformerBlockImpl(const SanaTransformerConfig& config);
    // tokens [B, h * w, D]; context [B, L, D]; bias [B, 1, 1, L] or undefined;
    // modulation [B, 6D] from time_embed -> [B, h * w, D]. result_unread: see
    // SanaGLUMBConvImpl::gated_residual (a checkpoint's function passes true).
    at::Tensor forward(const at::Tensor& tokens, const at::Tensor& context, const at::Tensor& bias,
                       const at::Tensor& modulation, int64_t height, int64_t width,
                       bool result_unread = false);
    at::Tensor scale_shift_table;  // [6, D]: shift, scale, gate for attention, then for the FFN
    torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};  // no weights unless configured (norm2)
    SanaLinearAttention attn1{nullptr};
    SanaCrossAttention attn2{nullptr};
    SanaGLUMBConv ff{nullptr};
};
TORCH_MODULE(SanaTransformerBlock);

}  // namespace sf::model
