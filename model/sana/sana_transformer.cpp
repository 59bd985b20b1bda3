#include "model/sana/sana_transformer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <tuple>

#include "core/error.h"
#include "core/shape.h"
#include "model/common/checkpoint.h"
#include "model/common/lora.h"

namespace sf::model {
namespace {

namespace nn = torch::nn;

[[noreturn]] void bad_input(const char* name, const at::Tensor& t, const std::string& want) {
    throw Error::InvalidArgument(fmt::format("SanaTransformer: {} has shape {}, expected {}", name,
                                             t.defined() ? shape_string(t) : "(none)", want));
}

const SanaTransformerConfig& validated(const SanaTransformerConfig& c) {
    c.validate();
    return c;
}

}  // namespace

SanaTransformerImpl::SanaTransformerImpl(const SanaTransformerConfig& config)
    : config_(validated(config)) {
    const auto& c = config_;
    const int64_t dim = c.inner_dim();
    patch_embed = register_module(
        "patch_embed",
        SanaPatchEmbed(c.in_channels, dim, c.patch_size, c.sample_size, c.interpolation_scale));
    time_embed = register_module("time_embed", SanaAdaLayerNormSingle(dim));
    caption_projection =
        register_module("caption_projection", SanaCaptionProjection(c.caption_channels, dim));
    // Upstream's caption_norm: RMSNorm(dim, eps=1e-5) with a weight, whatever norm_eps says.
    caption_norm = register_module("caption_norm", SanaRMSNorm(dim, 1e-5));
    transformer_blocks = register_module("transformer_blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
        blocks_.push_back(SanaTransformerBlock(c));
        transformer_blocks->push_back(blocks_.back());
    }
    scale_shift_table =
        register_parameter("scale_shift_table", torch::randn({2, dim}) / std::sqrt(double(dim)));
    proj_out =
        register_module("proj_out", nn::Linear(dim, c.patch_size * c.patch_size * c.out_channels));
}

void SanaTransformerImpl::check_inputs(const at::Tensor& x, const at::Tensor& context,
                                       const at::Tensor& timestep, const at::Tensor& mask) const {
    const auto& c = config_;
    const int64_t p = c.patch_size;
    if (!x.defined() || x.dim() != 4 || x.size(1) != c.in_channels || x.size(2) % p != 0 ||
        x.size(3) % p != 0 || x.size(2) == 0 || x.size(3) == 0) {
        bad_input("hidden_states", x,
                  fmt::format("[B, {}, H, W] with H and W positive multiples of patch_size {}",
                              c.in_channels, p));
    }
    const int64_t batch = x.size(0);
    if (!context.defined() || context.dim() != 3 || context.size(0) != batch ||
        context.size(2) != c.caption_channels) {
        bad_input("encoder_hidden_states", context,
                  fmt::format("[{}, L, {}] (batch, tokens, caption_channels)", batch,
                              c.caption_channels));
    }
    if (!timestep.defined() ||
        !(timestep.dim() == 0 || (timestep.dim() == 1 && timestep.size(0) == batch))) {
        bad_input("timestep", timestep, fmt::format("[{}] or a scalar", batch));
    }
    if (mask.defined() &&
        (mask.dim() != 2 || mask.size(0) != batch || mask.size(1) != context.size(1))) {
        bad_input("encoder_attention_mask", mask,
                  fmt::format("[{}, {}] (1 = token, 0 = padding)", batch, context.size(1)));
    }
}

SanaBlockInputs SanaTransformerImpl::embed(const at::Tensor& hidden_states,
                                           const at::Tensor& encoder_hidden_states,
                                           const at::Tensor& timestep,
                                           const at::Tensor& encoder_attention_mask) {
    check_inputs(hidden_states, encoder_hidden_states, timestep, encoder_attention_mask);
    const int64_t batch = hidden_states.size(0);
    SanaBlockInputs in;
    in.height = hidden_states.size(2) / config_.patch_size;
    in.width = hidden_states.size(3) / config_.patch_size;
    if (encoder_attention_mask.defined()) {
        // Upstream turns the 1/0 mask into a bias in the input's dtype: 0 keeps, -10000 drops.
        const at::Tensor keep = encoder_attention_mask.to(hidden_states.scalar_type());
        const at::Tensor bias = (1 - keep) * -10000.0;
        in.context_bias = bias.view({batch, 1, 1, -1});  // [B, L] -> [B, 1, 1, L]
    }
    in.tokens = patch_embed(hidden_states);  // [B, h * w, D]
    const at::Tensor t = timestep.dim() == 0 ? timestep.expand({batch}) : timestep;
    std::tie(in.modulation, in.embedded_timestep) = time_embed(t, in.tokens.scalar_type());
    at::Tensor context = caption_projection(encoder_hidden_states);
    context = context.view({batch, -1, in.tokens.size(-1)});  // [B, L, D]
    in.context = caption_norm(context);
    return in;
}

at::Tensor SanaTransformerImpl::run_block(size_t index, const at::Tensor& tokens,
                                          const SanaBlockInputs& in) {
    return blocks_.at(index)(tokens, in.context, in.context_bias, in.modulation, in.height,
                             in.width);
}

at::Tensor SanaTransformerImpl::unembed(const at::Tensor& tokens, const SanaBlockInputs& in) {
    const int64_t batch = tokens.size(0), p = config_.patch_size;
    // SanaModulatedNorm: LayerNorm without weights (eps 1e-6), shift and scale from the table
    // plus the embedded timestep.
    const at::Tensor table = scale_shift_table.unsqueeze(0);  // [2, D] -> [1, 2, D]
    const at::Tensor t = in.embedded_timestep.unsqueeze(1);   // [B, D] -> [B, 1, D]
    const auto mod = (table + t).chunk(2, 1);                 // shift, scale: [B, 1, D] each
    at::Tensor x = at::layer_norm(tokens, {tokens.size(-1)}, {}, {}, 1e-6);
    x = x * (1 + mod[1]) + mod[0];
    x = linear(proj_out, x);                                     // [B, h * w, p * p * C]
    x = x.reshape({batch, in.height, in.width, p, p, -1});       // -> [B, h, w, p, p, C]
    x = x.permute({0, 5, 1, 3, 2, 4});                           // -> [B, C, h, p, w, p]
    return x.reshape({batch, -1, in.height * p, in.width * p});  // -> [B, C, H, W]
}

at::Tensor SanaTransformerImpl::forward(const at::Tensor& hidden_states,
                                        const at::Tensor& encoder_hidden_states,
                                        const at::Tensor& timestep,
                                        const at::Tensor& encoder_attention_mask) {
    const SanaBlockInputs in =
        embed(hidden_states, encoder_hidden_states, timestep, encoder_attention_mask);
    swap_.begin_pass();
    at::Tensor tokens = in.tokens;
    const bool recompute = checkpoint_every_ > 0 && at::GradMode::is_enabled();
    for (size_t i = 0; i < blocks_.size(); ++i) {
        if ((recompute && static_cast<int64_t>(i) % checkpoint_every_ == 0) || swap_.swapped(i)) {
            // The closure holds the block and the grid, not `in`: the backward runs after this
            // frame is gone. The tensors travel as checkpoint inputs, so they are saved. With grad
            // it runs in the recompute only, which reads the result's graph, not its values.
            const int64_t height = in.height, width = in.width;
            auto block_fn = [block = blocks_[i], height, width](const std::vector<at::Tensor>& t) {
                return block.ptr()->forward(t[0], t[1], t[2], t[3], height, width,
                                            /*result_unread=*/at::GradMode::is_enabled());
            };
            tokens = checkpoint(block_fn, {tokens, in.context, in.context_bias, in.modulation},
                                swap_.swapped(i) ? swap_.scope(i) : CheckpointScope());
        } else {
            tokens = run_block(i, tokens, in);
        }
    }
    return unembed(tokens, in);
}

void SanaTransformerImpl::set_blocks_to_swap(int64_t n, c10::Device device) {
    swap_.set(blocks(), n, device);
}

void SanaTransformerImpl::set_gradient_checkpointing(int64_t every) {
    if (every < 0) {
        throw Error::InvalidArgument(fmt::format(
            "SanaTransformer: gradient checkpointing every {} blocks; want 0 (off) or more",
            every));
    }
    checkpoint_every_ = every;
}

std::vector<std::shared_ptr<torch::nn::Module>> SanaTransformerImpl::blocks() {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& block : blocks_) out.push_back(block.ptr());
    return out;
}

void SanaTransformerImpl::set_attention(AttentionKernel kernel, int64_t chunk) {
    if (chunk < 1) {
        throw Error::InvalidArgument(
            fmt::format("SanaTransformer: attention chunk must be at least 1, got {}", chunk));
    }
    for (auto& block : blocks_) {
        block->attn2->attention_kernel = kernel;
        block->attn2->attention_chunk = chunk;
        // The linear self-attention has no fused kernel: both memory-saving kinds chunk it.
        block->attn1->chunk_tokens = kernel == AttentionKernel::kDense ? 0 : chunk;
    }
}

void SanaTransformerImpl::set_feed_forward_chunk(int64_t rows) {
    if (rows < 0) {
        throw Error::InvalidArgument(
            fmt::format("SanaTransformer: feed-forward chunk must be 0 (off) or a number of "
                        "latent rows, got {}",
                        rows));
    }
    for (auto& block : blocks_) block->ff->chunk_rows = rows;
}

}  // namespace sf::model
