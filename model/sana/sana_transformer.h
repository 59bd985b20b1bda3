// The Sana diffusion transformer, diffusers' SanaTransformer2DModel (v0.33.1) in LibTorch: the
// same computation and the same state-dict keys, so a diffusers `transformer/` directory loads
// with load_weights(*model, dir) and a model saved with save_weights loads in diffusers.
//
//   SanaTransformer model(SanaTransformerConfig::from_json_file(dir));
//   load_weights(*model, dir);
//   at::Tensor velocity = model(latents, caption_features, timesteps, caption_mask);
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

#include "model/common/block_swap.h"
#include "model/common/diffusion_transformer.h"
#include "model/sana/sana_blocks.h"
#include "model/sana/sana_config.h"

namespace sf::model {

// What every block needs, computed once per forward from the model's inputs.
struct SanaBlockInputs {
    at::Tensor tokens;              // [B, h * w, D] patch tokens (position embedding added)
    at::Tensor context;             // [B, L, D] projected and normalised caption tokens
    at::Tensor context_bias;        // [B, 1, 1, L] additive mask, or undefined (no mask)
    at::Tensor modulation;          // [B, 6D] time_embed output, shared by every block
    at::Tensor embedded_timestep;   // [B, D] for the final modulated norm
    int64_t height = 0, width = 0;  // the patch grid, h x w
};

class SanaTransformerImpl : public torch::nn::Module, public DiffusionTransformer {
public:
    // Validates the config (sf::Error kInvalidArgument naming the field). Weights are initialised
    // as upstream's constructor does; load_weights() replaces them.
    explicit SanaTransformerImpl(const SanaTransformerConfig& config);

    // hidden_states [B, in_channels, H, W] latents, H and W multiples of patch_size;
    // encoder_hidden_states [B, L, caption_channels]; timestep [B] (or a scalar for all), any
    // real dtype, in [0, 1000] as the flow-matching schedule has it; encoder_attention_mask
    // [B, L], 1 for a token and 0 for padding, or undefined for none
    // -> [B, out_channels, H, W]. A bad shape is sf::Error kInvalidArgument naming the input.
    at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                       const at::Tensor& timestep,
                       const at::Tensor& encoder_attention_mask = at::Tensor()) override;

    // forward() in three steps, for callers that run the blocks themselves (gradient
    // checkpointing, block swapping): embed, every block in order, then unembed.
    SanaBlockInputs embed(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                          const at::Tensor& timestep, const at::Tensor& encoder_attention_mask);
    at::Tensor run_block(size_t index, const at::Tensor& tokens, const SanaBlockInputs& in);
    // Final modulated norm, proj_out and unpatchify: [B, h * w, D] -> [B, out_channels, H, W].
    at::Tensor unembed(const at::Tensor& tokens, const SanaBlockInputs& in);

    // Gradient checkpointing of the blocks, applied by forward() in grad mode: 0 off (the
    // default), 1 every block, k the blocks whose index is a multiple of k. A checkpointed block
    // keeps only its inputs and runs again in backward (model/checkpoint.h). Negative is
    // sf::Error kInvalidArgument.
    void set_gradient_checkpointing(int64_t every) override;
    int64_t gradient_checkpointing() const { return checkpoint_every_; }

    // The cross-attention kernel of every block (model/chunked_attention.h); kDense by default.
    // `chunk` (query rows per chunk, at least 1) is used by kChunked, and by kFused where the
    // LibTorch has no fused attention. With kChunked and kFused the linear self-attention runs
    // over `chunk` tokens at a time too (SanaLinearAttentionImpl::chunk_tokens). chunk < 1 is
    // sf::Error kInvalidArgument.
    void set_attention(AttentionKernel kernel, int64_t chunk = 1024) override;
    // Video transformers only: any value but 0 is sf::Error kInvalidArgument.
    void set_feed_forward_chunk(int64_t rows) override;
    void set_blocks_to_swap(int64_t n, c10::Device device) override;
    const BlockSwap& block_swap() const override { return swap_; }

    const SanaTransformerConfig& config() const { return config_; }
    size_t num_blocks() const { return blocks_.size(); }

    // DiffusionTransformer.
    torch::nn::Module& module() override { return *this; }
    std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
    int64_t latent_rank() const override { return 4; }
    std::string class_name() const override { return "SanaTransformer2DModel"; }
    std::string config_json() const override { return config_.to_json(); }

    // Registered under upstream's names.
    SanaPatchEmbed patch_embed{nullptr};
    SanaAdaLayerNormSingle time_embed{nullptr};
    SanaCaptionProjection caption_projection{nullptr};
    SanaRMSNorm caption_norm{nullptr};
    torch::nn::ModuleList transformer_blocks{nullptr};
    at::Tensor scale_shift_table;  // [2, D]: shift and scale of the final norm
    torch::nn::Linear proj_out{nullptr};

private:
    void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                      const at::Tensor& timestep, const at::Tensor& encoder_attention_mask) const;

    SanaTransformerConfig config_;
    std::vector<SanaTransformerBlock> blocks_;  // the same modules as transformer_blocks
    int64_t checkpoint_every_ = 0;
    BlockSwap swap_;
};
TORCH_MODULE(SanaTransformer);

}  // namespace sf::model
