// What training needs of a diffusion transformer, whatever it denoises: TrainStep, the trainer
// and every memory remedy drive this interface, so the image transformer (model/sana) and the
// video transformer (model/sana_video) share one step, one trainer and one set of remedies.
//
// Latents are [B, C, h, w] for images and [B, C, f, h, w] for video; the velocity predicted has
// the latents' shape. A model implements it beside torch::nn::Module (its Impl class derives from
// both), so the module's parameters, train() and to() are reached through module().
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/common/block_swap.h"
#include "model/common/chunked_attention.h"

namespace torch::nn {
class Module;
}

namespace sf::model {

class DiffusionTransformer {
public:
    virtual ~DiffusionTransformer() = default;

    // The velocity for `latents` (noised) at `timestep` ([B], in [0, num_train_timesteps]; the
    // video transformer also takes [B, f], one per latent frame),
    // conditioned on `caption` [B, L, caption_channels] with `caption_mask` [B, L] (1 for a
    // token; undefined: every token counts).
    virtual at::Tensor forward(const at::Tensor& latents, const at::Tensor& caption,
                               const at::Tensor& timestep, const at::Tensor& caption_mask) = 0;

    virtual torch::nn::Module& module() = 0;
    // The transformer blocks in order: the unit of gradient checkpointing and of block swap.
    virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() = 0;
    // 0 off; k: the blocks whose index is a multiple of k keep only their inputs and run again
    // in backward.
    virtual void set_gradient_checkpointing(int64_t every) = 0;
    virtual void set_attention(AttentionKernel kernel, int64_t chunk) = 0;
    // The feed-forward run over `size` latent rows (of the token grid: an image transformer) or
    // latent frames (a video transformer) at a time, each chunk recomputed in backward; 0: all
    // at once. Negative is sf::Error kInvalidArgument.
    virtual void set_feed_forward_chunk(int64_t size) = 0;
    // Block swap (model/common/block_swap.h): the weights of the first `n` blocks in host memory,
    // lent to `device` for each run of the block, which is then always checkpointed; 0 none.
    // n past the blocks is sf::Error kInvalidArgument.
    virtual void set_blocks_to_swap(int64_t n, c10::Device device) = 0;
    // The swapped blocks, with the count of their copies to the device so far.
    virtual const BlockSwap& block_swap() const = 0;

    // 4 for [B, C, h, w] latents, 5 for [B, C, f, h, w].
    virtual int64_t latent_rank() const = 0;
    // The upstream class name, e.g. "SanaTransformer2DModel", for logs and settings.
    virtual std::string class_name() const = 0;
    // The diffusers config.json of this model, written beside its weights.
    virtual std::string config_json() const = 0;
};

}  // namespace sf::model
