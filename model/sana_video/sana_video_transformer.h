// The SANA-Video diffusion transformer, diffusers' SanaVideoTransformer3DModel (v0.36.0) in
// LibTorch: the same computation and the same state-dict keys, so a diffusers `transformer/`
// directory of SANA-Video loads with load_weights(*model, dir), and a model saved with
// save_weights loads in diffusers.
//
//   SanaVideoTransformer model(SanaVideoTransformerConfig::from_json_file(dir));
//   load_weights(*model, dir);
//   at::Tensor velocity = model(latents, caption_features, timesteps, caption_mask);
//
// Latents are [B, C, F, H, W] (F latent frames; an image is F = 1). The timestep may be one per
// sample [B], one per latent frame [B, F / p_t] (image-to-video: frame 0 at 0; chunked training:
// one per chunk of frames), or upstream's per-token [B, 1, F / p_t, H / p_h, W / p_w]. Per-frame
// timesteps compute one modulation per frame, not per token: the same numbers upstream gets from
// the per-token form, without its [B, N, 6D] tensor.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/common/block_swap.h"
#include "model/common/diffusion_transformer.h"
#include "model/sana_video/sana_video_blocks.h"
#include "model/sana_video/sana_video_config.h"

namespace sf::model {

// What every block needs, computed once per forward from the model's inputs.
struct SanaVideoBlockInputs {
    at::Tensor tokens;                  // [B, N, D] patch tokens
    at::Tensor context;                 // [B, L, D] projected and normalised caption tokens
    at::Tensor context_bias;            // [B, 1, 1, L] additive mask, or undefined (no mask)
    at::Tensor modulation;              // [B, G, 6D] time_embed output per group of tokens
    at::Tensor embedded_timestep;       // [B, G, D] for the final modulated norm
    at::Tensor rotary_cos, rotary_sin;  // [N, head_dim / 2]
    VideoGrid grid;                     // the patch grid
};

class SanaVideoTransformerImpl : public torch::nn::Module, public DiffusionTransformer {
public:
    // Validates the config (sf::Error kInvalidArgument naming the field). Weights are initialised
    // as upstream's constructor does; load_weights() replaces them.
    explicit SanaVideoTransformerImpl(const SanaVideoTransformerConfig& config);

    // hidden_states [B, in_channels, F, H, W], each of F, H, W a multiple of its patch size;
    // encoder_hidden_states [B, L, caption_channels]; timestep as the header says, in [0, 1000];
    // encoder_attention_mask [B, L], 1 for a token and 0 for padding, or undefined for none
    // -> [B, out_channels, F, H, W]. A bad shape is sf::Error kInvalidArgument naming the input.
    // A model with guidance_embeds needs forward_guided().
    at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                       const at::Tensor& timestep,
                       const at::Tensor& encoder_attention_mask = at::Tensor()) override;
    // forward() with upstream's `guidance` ([B], a scalar for all, or undefined without
    // guidance_embeds).
    at::Tensor forward_guided(const at::Tensor& hidden_states,
                              const at::Tensor& encoder_hidden_states, const at::Tensor& timestep,
                              const at::Tensor& encoder_attention_mask, const at::Tensor& guidance);

    // forward() in three steps, for callers that run the blocks themselves: embed, every block in
    // order, then unembed.
    SanaVideoBlockInputs embed(const at::Tensor& hidden_states,
                               const at::Tensor& encoder_hidden_states, const at::Tensor& timestep,
                               const at::Tensor& encoder_attention_mask,
                               const at::Tensor& guidance = at::Tensor());
    at::Tensor run_block(size_t index, const at::Tensor& tokens, const SanaVideoBlockInputs& in);
    // Final modulated norm, proj_out and unpatchify: [B, N, D] -> [B, out_channels, F, H, W].
    at::Tensor unembed(const at::Tensor& tokens, const SanaVideoBlockInputs& in);

    // As SanaTransformerImpl's: 0 off, k the blocks whose index is a multiple of k.
    void set_gradient_checkpointing(int64_t every) override;
    // The cross-attention kernel of every block (model/chunked_attention.h), kDense by default;
    // kChunked and kFused also run the linear self-attention over `chunk` tokens at a time.
    void set_attention(AttentionKernel kernel, int64_t chunk = 1024) override;
    // SanaVideoFeedForwardImpl::chunk_frames of every block; negative is kInvalidArgument.
    void set_feed_forward_chunk(int64_t frames) override;
    void set_blocks_to_swap(int64_t n, c10::Device device) override;
    const BlockSwap& block_swap() const override { return swap_; }

    const SanaVideoTransformerConfig& config() const { return config_; }
    size_t num_blocks() const { return blocks_.size(); }

    // DiffusionTransformer.
    torch::nn::Module& module() override { return *this; }
    std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
    int64_t latent_rank() const override { return 5; }
    std::string class_name() const override { return "SanaVideoTransformer3DModel"; }
    std::string config_json() const override { return config_.to_json(); }

    // Registered under upstream's names. time_embed is AdaLayerNormSingle, or the guidance
    // embedder with guidance_embeds (one of the two is null).
    torch::nn::Conv3d patch_embedding{nullptr};
    SanaAdaLayerNormSingle time_embed{nullptr};
    SanaVideoGuidanceEmbedding guided_time_embed{nullptr};
    SanaCaptionProjection caption_projection{nullptr};
    SanaRMSNorm caption_norm{nullptr};
    torch::nn::ModuleList transformer_blocks{nullptr};
    at::Tensor scale_shift_table;  // [2, D]: shift and scale of the final norm
    torch::nn::Linear proj_out{nullptr};

private:
    void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                      const at::Tensor& timestep, const at::Tensor& encoder_attention_mask,
                      const at::Tensor& guidance) const;
    // The timestep as one value per group of tokens: [B * G] and G.
    std::pair<at::Tensor, int64_t> timestep_groups(const at::Tensor& timestep, int64_t batch,
                                                   const VideoGrid& grid) const;

    SanaVideoTransformerConfig config_;
    std::vector<SanaVideoTransformerBlock> blocks_;  // the same modules as transformer_blocks
    int64_t checkpoint_every_ = 0;
    BlockSwap swap_;
};
TORCH_MODULE(SanaVideoTransformer);

}  // namespace sf::model
