#include "model/sana_video/sana_video_transformer.h"

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
    throw Error::InvalidArgument(fmt::format("SanaVideoTransformer: {} has shape {}, expected {}",
                                             name, t.defined() ? shape_string(t) : "(none)", want));
}

const SanaVideoTransformerConfig& validated(const SanaVideoTransformerConfig& c) {
    c.validate();
    return c;
}

}  // namespace

SanaVideoTransformerImpl::SanaVideoTransformerImpl(const SanaVideoTransformerConfig& config)
    : config_(validated(config)) {
    const auto& c = config_;
    const int64_t dim = c.inner_dim();
    const std::vector<int64_t> patch(c.patch_size.begin(), c.patch_size.end());
    patch_embedding = register_module(
        "patch_embedding", nn::Conv3d(nn::Conv3dOptions(c.in_channels, dim, patch).stride(patch)));
    if (c.guidance_embeds) {
        guided_time_embed = register_module("time_embed", SanaVideoGuidanceEmbedding(dim));
    } else {
        time_embed = register_module("time_embed", SanaAdaLayerNormSingle(dim));
    }
    caption_projection =
        register_module("caption_projection", SanaCaptionProjection(c.caption_channels, dim));
    caption_norm = register_module("caption_norm", SanaRMSNorm(dim, 1e-5));
    transformer_blocks = register_module("transformer_blocks", nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; ++i) {
        blocks_.push_back(SanaVideoTransformerBlock(c));
        transformer_blocks->push_back(blocks_.back());
    }
    scale_shift_table =
        register_parameter("scale_shift_table", torch::randn({2, dim}) / std::sqrt(double(dim)));
    proj_out = register_module("proj_out", nn::Linear(dim, c.patch_volume() * c.out_channels));
}

void SanaVideoTransformerImpl::check_inputs(const at::Tensor& x, const at::Tensor& context,
                                            const at::Tensor& timestep, const at::Tensor& mask,
                                            const at::Tensor& guidance) const {
    const auto& c = config_;
    const auto& p = c.patch_size;
    bool ok = x.defined() && x.dim() == 5 && x.size(1) == c.in_channels;
    for (int i = 0; ok && i < 3; ++i) {
        const int64_t size = x.size(2 + i);
        ok = size > 0 && size % p[i] == 0 && size / p[i] <= c.rope_max_seq_len;
    }
    if (!ok) {
        bad_input("hidden_states", x,
                  fmt::format("[B, {}, F, H, W] with F, H, W positive multiples of patch_size "
                              "({}, {}, {}) and at most rope_max_seq_len = {} patches each",
                              c.in_channels, p[0], p[1], p[2], c.rope_max_seq_len));
    }
    const int64_t batch = x.size(0);
    const int64_t f = x.size(2) / p[0], h = x.size(3) / p[1], w = x.size(4) / p[2];
    if (!context.defined() || context.dim() != 3 || context.size(0) != batch ||
        context.size(2) != c.caption_channels) {
        bad_input("encoder_hidden_states", context,
                  fmt::format("[{}, L, {}] (batch, tokens, caption_channels)", batch,
                              c.caption_channels));
    }
    const bool per_sample =
        timestep.defined() &&
        (timestep.dim() == 0 || (timestep.dim() == 1 && timestep.size(0) == batch));
    const bool per_frame = timestep.defined() && timestep.dim() == 2 && timestep.size(0) == batch &&
                           timestep.size(1) == f;
    const bool per_token =
        timestep.defined() && timestep.sizes() == at::IntArrayRef({batch, 1, f, h, w});
    if (!per_sample && !per_frame && !per_token) {
        bad_input("timestep", timestep,
                  fmt::format("[{0}] or a scalar (per sample), [{0}, {1}] (per latent frame) or "
                              "[{0}, 1, {1}, {2}, {3}] (per token)",
                              batch, f, h, w));
    }
    if (mask.defined() &&
        (mask.dim() != 2 || mask.size(0) != batch || mask.size(1) != context.size(1))) {
        bad_input("encoder_attention_mask", mask,
                  fmt::format("[{}, {}] (1 = token, 0 = padding)", batch, context.size(1)));
    }
    if (c.guidance_embeds) {
        if (!guidance.defined() ||
            !(guidance.dim() == 0 || (guidance.dim() == 1 && guidance.size(0) == batch))) {
            bad_input("guidance", guidance,
                      fmt::format("[{}] or a scalar (the model has guidance_embeds)", batch));
        }
    } else if (guidance.defined()) {
        throw Error::InvalidArgument(
            "SanaVideoTransformer: a guidance value was given but the model has no guidance "
            "embedder (guidance_embeds is false)");
    }
}

std::pair<at::Tensor, int64_t> SanaVideoTransformerImpl::timestep_groups(
    const at::Tensor& timestep, int64_t batch, const VideoGrid& grid) const {
    if (timestep.dim() == 0) return {timestep.expand({batch}), 1};
    if (timestep.dim() == 1) return {timestep, 1};
    if (timestep.dim() == 2) return {timestep.reshape({-1}), grid.frames};
    return {timestep.reshape({-1}), grid.tokens()};  // [B, 1, f, h, w], frame-major
}

SanaVideoBlockInputs SanaVideoTransformerImpl::embed(const at::Tensor& hidden_states,
                                                     const at::Tensor& encoder_hidden_states,
                                                     const at::Tensor& timestep,
                                                     const at::Tensor& encoder_attention_mask,
                                                     const at::Tensor& guidance) {
    check_inputs(hidden_states, encoder_hidden_states, timestep, encoder_attention_mask, guidance);
    const auto& p = config_.patch_size;
    const int64_t batch = hidden_states.size(0);
    SanaVideoBlockInputs in;
    in.grid = {hidden_states.size(2) / p[0], hidden_states.size(3) / p[1],
               hidden_states.size(4) / p[2]};
    if (encoder_attention_mask.defined()) {
        // Upstream turns the 1/0 mask into a bias in the input's dtype: 0 keeps, -10000 drops.
        const at::Tensor keep = encoder_attention_mask.to(hidden_states.scalar_type());
        in.context_bias = ((1 - keep) * -10000.0).view({batch, 1, 1, -1});  // [B, 1, 1, L]
    }
    std::tie(in.rotary_cos, in.rotary_sin) =
        sana_video_rotary(config_.attention_head_dim, in.grid, hidden_states.device());
    in.tokens = patch_embedding(hidden_states).flatten(2).transpose(1, 2);  // [B, N, D]

    const auto dtype = in.tokens.scalar_type();
    const auto [t, groups] = timestep_groups(timestep, batch, in.grid);  // [B * G]
    if (guided_time_embed) {
        // The guidance value is one per sample: every group of a sample shares it.
        const at::Tensor g = guidance.dim() == 0 ? guidance.expand({batch}) : guidance;
        const at::Tensor per_group = g.unsqueeze(1).expand({batch, groups}).reshape({-1});
        std::tie(in.modulation, in.embedded_timestep) = guided_time_embed(t, per_group, dtype);
    } else {
        std::tie(in.modulation, in.embedded_timestep) = time_embed(t, dtype);
    }
    in.modulation = in.modulation.view({batch, groups, -1});                // [B, G, 6D]
    in.embedded_timestep = in.embedded_timestep.view({batch, groups, -1});  // [B, G, D]

    const at::Tensor context = caption_projection(encoder_hidden_states);
    in.context = caption_norm(context.view({batch, -1, in.tokens.size(-1)}));  // [B, L, D]
    return in;
}

at::Tensor SanaVideoTransformerImpl::run_block(size_t index, const at::Tensor& tokens,
                                               const SanaVideoBlockInputs& in) {
    return blocks_.at(index)(tokens, in.context, in.context_bias, in.modulation, in.rotary_cos,
                             in.rotary_sin, in.grid);
}

at::Tensor SanaVideoTransformerImpl::unembed(const at::Tensor& tokens,
                                             const SanaVideoBlockInputs& in) {
    const int64_t batch = tokens.size(0);
    const auto& p = config_.patch_size;
    const auto& g = in.grid;
    // SanaModulatedNorm per group: LayerNorm without weights (eps 1e-6), shift and scale from
    // the table plus the embedded timestep.
    const at::Tensor table = scale_shift_table.unsqueeze(0).unsqueeze(0);    // [1, 1, 2, D]
    const auto mod = (table + in.embedded_timestep.unsqueeze(2)).unbind(2);  // [B, G, D] each
    at::Tensor x = at::layer_norm(tokens, {tokens.size(-1)}, {}, {}, 1e-6);
    x = linear(proj_out, modulate_groups(x, mod[0], mod[1]));  // [B, N, p_t p_h p_w C]
    x = x.reshape({batch, g.frames, g.height, g.width, p[0], p[1], p[2], -1});
    x = x.permute({0, 7, 1, 4, 2, 5, 3, 6});  // -> [B, C, f, p_t, h, p_h, w, p_w]
    return x.reshape({batch, -1, g.frames * p[0], g.height * p[1], g.width * p[2]});
}

at::Tensor SanaVideoTransformerImpl::forward(const at::Tensor& hidden_states,
                                             const at::Tensor& encoder_hidden_states,
                                             const at::Tensor& timestep,
                                             const at::Tensor& encoder_attention_mask) {
    return forward_guided(hidden_states, encoder_hidden_states, timestep, encoder_attention_mask,
                          at::Tensor());
}

at::Tensor SanaVideoTransformerImpl::forward_guided(const at::Tensor& hidden_states,
                                                    const at::Tensor& encoder_hidden_states,
                                                    const at::Tensor& timestep,
                                                    const at::Tensor& encoder_attention_mask,
                                                    const at::Tensor& guidance) {
    const SanaVideoBlockInputs in =
        embed(hidden_states, encoder_hidden_states, timestep, encoder_attention_mask, guidance);
    swap_.begin_pass();
    at::Tensor tokens = in.tokens;
    const bool recompute = checkpoint_every_ > 0 && at::GradMode::is_enabled();
    for (size_t i = 0; i < blocks_.size(); ++i) {
        if ((recompute && static_cast<int64_t>(i) % checkpoint_every_ == 0) || swap_.swapped(i)) {
            // The closure holds the block and the grid, not `in`: the backward runs after this
            // frame is gone. The tensors travel as checkpoint inputs, so they are saved.
            auto block_fn = [block = blocks_[i], grid = in.grid](const std::vector<at::Tensor>& t) {
                return block.ptr()->forward(t[0], t[1], t[2], t[3], t[4], t[5], grid);
            };
            tokens = checkpoint(
                block_fn,
                {tokens, in.context, in.context_bias, in.modulation, in.rotary_cos, in.rotary_sin},
                swap_.swapped(i) ? swap_.scope(i) : CheckpointScope());
        } else {
            tokens = run_block(i, tokens, in);
        }
    }
    return unembed(tokens, in);
}

void SanaVideoTransformerImpl::set_blocks_to_swap(int64_t n, c10::Device device) {
    swap_.set(blocks(), n, device);
}

void SanaVideoTransformerImpl::set_gradient_checkpointing(int64_t every) {
    if (every < 0) {
        throw Error::InvalidArgument(fmt::format(
            "SanaVideoTransformer: gradient checkpointing every {} blocks; want 0 (off) or more",
            every));
    }
    checkpoint_every_ = every;
}

std::vector<std::shared_ptr<torch::nn::Module>> SanaVideoTransformerImpl::blocks() {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& block : blocks_) out.push_back(block.ptr());
    return out;
}

void SanaVideoTransformerImpl::set_attention(AttentionKernel kernel, int64_t chunk) {
    if (chunk < 1) {
        throw Error::InvalidArgument(
            fmt::format("SanaVideoTransformer: attention chunk must be at least 1, got {}", chunk));
    }
    for (auto& block : blocks_) {
        block->attn2->attention_kernel = kernel;
        block->attn2->attention_chunk = chunk;
        // The linear self-attention has no fused kernel: both memory-saving kinds chunk it.
        block->attn1->chunk_tokens = kernel == AttentionKernel::kDense ? 0 : chunk;
    }
}

void SanaVideoTransformerImpl::set_feed_forward_chunk(int64_t frames) {
    if (frames < 0) {
        throw Error::InvalidArgument(fmt::format(
            "SanaVideoTransformer: feed-forward chunk of {} frames; want 0 (off) or more", frames));
    }
    for (auto& block : blocks_) block->ff->chunk_frames = frames;
}

}  // namespace sf::model
