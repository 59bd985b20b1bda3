#include "stages/plan/memory_model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "model/common/lora.h"
#include "model/sana/sana_transformer.h"
#include "model/sana_video/sana_video_transformer.h"
#include "stages/train/quantized_state.h"

namespace sf::plan {

std::string PlanRemedies::key(bool lora) const {
    return fmt::format("{}/{}/ckpt{}{}/{}/ff{}/{}/{}", lora ? "lora" : "full",
                       mixed_precision == "no" ? "fp32" : "bf16", gradient_checkpointing,
                       blocks_to_swap > 0 ? "/swap" : "", chunked_attention() ? "chunked" : "dense",
                       ff_chunk_size > 0 ? 1 : 0, fused_backward ? "fused" : "unfused", optimizer);
}

std::string PlanRemedies::flags() const {
    std::vector<std::string> f;
    if (mixed_precision != "no") f.push_back("--mixed_precision " + mixed_precision);
    if (gradient_checkpointing == 1) f.push_back("--gradient_checkpointing");
    if (gradient_checkpointing > 1) {
        f.push_back(fmt::format("--gradient_checkpointing --gradient_checkpointing_every {}",
                                gradient_checkpointing));
    }
    if (accumulation > 1)
        f.push_back(fmt::format("--gradient_accumulation_steps {}", accumulation));
    if (micro_batch_split > 1)
        f.push_back(fmt::format("--micro_batch_split {}", micro_batch_split));
    if (chunked_attention()) f.push_back("--attention " + attention);
    if (ff_chunk_size > 0) f.push_back(fmt::format("--ff_chunk_size {}", ff_chunk_size));
    if (fused_backward) f.push_back("--fused_backward_pass");
    if (optimizer != "adamw") f.push_back("--optimizer " + optimizer);
    if (blocks_to_swap > 0) f.push_back(fmt::format("--blocks_to_swap {}", blocks_to_swap));
    if (offload_optimizer) f.push_back("--offload_optimizer");
    return fmt::format("{}", fmt::join(f, " "));
}

PlanRemedies PlanRemedies::calibrated() const {
    PlanRemedies c = *this;
    c.blocks_to_swap = blocks_to_swap > 0 && gradient_checkpointing == 0 ? 1 : 0;
    c.offload_optimizer = false;
    return c;
}

int64_t checkpointed_blocks(int64_t num_layers, const PlanRemedies& r) {
    int64_t n = 0;
    for (int64_t i = 0; i < num_layers; ++i) {
        const bool every = r.gradient_checkpointing > 0 && i % r.gradient_checkpointing == 0;
        if (every || i < r.blocks_to_swap) ++n;
    }
    return n;
}

int64_t lent_blocks(int64_t num_layers, const PlanRemedies& r) {
    const int64_t swapped = std::clamp<int64_t>(r.blocks_to_swap, 0, num_layers);
    if (checkpointed_blocks(num_layers, r) < num_layers) return 0;
    return std::min<int64_t>(swapped, 2);
}

int64_t ParameterCensus::state_bytes(const std::string& optimizer) const {
    if (optimizer == "adamw") return adamw_state_bytes;
    if (optimizer == "adamw8bit") return adamw8bit_state_bytes;
    if (optimizer == "prodigy") return prodigy_state_bytes;
    throw Error::InvalidArgument(
        fmt::format("--optimizer: {} is not adamw, adamw8bit or prodigy", optimizer));
}

int64_t ParameterCensus::block_state_bytes(const std::string& optimizer) const {
    if (optimizer == "adamw8bit") return block_adamw8bit_state_bytes;
    return optimizer == "prodigy" ? block_prodigy_state_bytes : block_adamw_state_bytes;
}

Structure structure_of(const PlanShape& shape) {
    Structure st;
    auto take = [&](const auto& c) {
        st.layers = c.num_layers;
        st.inner = c.inner_dim();
        st.ff = c.ff_hidden_dim();
        st.heads = c.num_attention_heads;
        st.cross_heads = c.num_cross_attention_heads;
        st.cross_inner = c.cross_inner_dim();
        st.caption_channels = c.caption_channels;
        st.in_channels = c.in_channels;
    };
    if (shape.video) {
        take(*shape.video);
        st.video = true;
        st.patch_frames = shape.video->patch_size[0];
        st.patch_height = shape.video->patch_size[1];
        st.patch_width = shape.video->patch_size[2];
        st.frames = shape.latent_frames / st.patch_frames;
    } else {
        take(shape.config);
        st.patch_height = st.patch_width = shape.config.patch_size;
    }
    st.rows = shape.latent_height / st.patch_height;
    st.row_tokens = shape.latent_width / st.patch_width;
    return st;
}

PlanShape with_layers(PlanShape shape, int64_t layers) {
    if (shape.video) {
        shape.video->num_layers = layers;
    } else {
        shape.config.num_layers = layers;
    }
    return shape;
}

std::vector<int64_t> latent_sizes(const PlanShape& shape) {
    const Structure st = structure_of(shape);
    if (st.video)
        return {shape.batch, st.in_channels, shape.latent_frames, shape.latent_height,
                shape.latent_width};
    return {shape.batch, st.in_channels, shape.latent_height, shape.latent_width};
}

std::shared_ptr<model::DiffusionTransformer> build_transformer(const PlanShape& shape) {
    std::shared_ptr<model::DiffusionTransformer> t;
    if (shape.video) {
        t = model::SanaVideoTransformer(*shape.video).ptr();
    } else {
        t = model::SanaTransformer(shape.config).ptr();
    }
    if (shape.lora_rank > 0) {
        model::LoRAConfig lora;
        lora.rank = shape.lora_rank;
        lora.alpha = static_cast<double>(shape.lora_rank);
        lora.targets = shape.lora_targets;
        model::add_lora(t->module(), lora);
    }
    return t;
}

namespace {

ParameterCensus census_of(const PlanShape& shape, int64_t layers) {
    torch::NoGradGuard no_grad;
    const std::shared_ptr<model::DiffusionTransformer> t =
        build_transformer(with_layers(shape, layers));
    torch::nn::Module& m = t->module();
    ParameterCensus n;
    for (const auto& p : m.parameters()) n.total += p.numel();
    for (const auto& [name, p] : model::trainable_parameters(m)) {
        const int64_t e = p.numel();
        n.trainable += e;
        n.largest_trainable = std::max(n.largest_trainable, e);
        n.adamw_state_bytes += 2 * e * 4;
        const int64_t blocks = (e + train::kQuantBlock - 1) / train::kQuantBlock;
        n.adamw8bit_state_bytes += e >= train::kMin8BitSize ? 2 * (e + blocks * 4) : 2 * e * 4;
        n.prodigy_state_bytes += p.any().item<bool>() ? 4 * e * 4 : 3 * e * 4 + 4;
    }
    return n;
}

}  // namespace

ParameterCensus count_parameters(const PlanShape& shape) {
    const ParameterCensus one = census_of(shape, 1), two = census_of(shape, 2);
    const int64_t more = structure_of(shape).layers - 1;
    ParameterCensus n;
    n.total = one.total + more * (two.total - one.total);
    n.trainable = one.trainable + more * (two.trainable - one.trainable);
    n.adamw_state_bytes =
        one.adamw_state_bytes + more * (two.adamw_state_bytes - one.adamw_state_bytes);
    n.adamw8bit_state_bytes =
        one.adamw8bit_state_bytes + more * (two.adamw8bit_state_bytes - one.adamw8bit_state_bytes);
    n.prodigy_state_bytes =
        one.prodigy_state_bytes + more * (two.prodigy_state_bytes - one.prodigy_state_bytes);
    n.largest_trainable = two.largest_trainable;
    n.block_total = two.total - one.total;
    n.block_trainable = two.trainable - one.trainable;
    n.block_adamw_state_bytes = two.adamw_state_bytes - one.adamw_state_bytes;
    n.block_adamw8bit_state_bytes = two.adamw8bit_state_bytes - one.adamw8bit_state_bytes;
    n.block_prodigy_state_bytes = two.prodigy_state_bytes - one.prodigy_state_bytes;
    return n;
}

const std::vector<std::string> kFeatureNames = {
    "constant",
    "plain blocks x m x N x D",
    "plain blocks x m x N x T x cross heads (dense cross-attention)",
    "plain blocks x m x N x heads",
    "plain blocks x m x N",
    "plain blocks x m x N x D (whole self-attention)",
    "plain blocks x m x N x ff width (whole feed-forward)",
    "checkpointed blocks x m x N x D",
    "m x N x D",
    "m x N x T x cross heads (dense cross-attention)",
    "m x N x heads",
    "m x N",
    "m x N x D (whole self-attention)",
    "m x N x ff width (whole feed-forward)",
    "blocks x m x T x cross width",
    "m x T x caption channels",
    "m x N x latent channels",
    "batch x T x caption channels",
    "batch x N x latent channels",
    "trainable parameters",
    "parameters",
    "m x chunk x T x cross heads (chunked cross-attention)",
    "m x chunk x D (chunked self-attention, image or video)",
    "m x one chunk's tokens (ff rows + 2 halo rows, or ff frames) x ff width (chunked "
    "feed-forward)",
    "blocks",
};

std::vector<double> step_features(const PlanShape& shape, const PlanRemedies& r,
                                  const ParameterCensus& census) {
    const Structure c = structure_of(shape);
    const int64_t rows = c.rows, row_tokens = c.row_tokens;
    const int64_t tokens = c.tokens();
    const double n = static_cast<double>(tokens);
    // Samples a pass holds: a micro-batch, or its part under --micro_batch_split.
    const int64_t micro = shape.batch / std::max<int64_t>(1, r.accumulation);
    const int64_t split = std::max<int64_t>(1, r.micro_batch_split);
    const double m = static_cast<double>((micro + split - 1) / split);
    const double batch = static_cast<double>(shape.batch);
    const double t = static_cast<double>(shape.caption_tokens);
    const double d = static_cast<double>(c.inner);
    const double ff = static_cast<double>(c.ff);
    const double hc = static_cast<double>(c.cross_heads);
    const double h = static_cast<double>(c.heads);
    const double blocks = static_cast<double>(c.layers);
    const double ckpt = static_cast<double>(checkpointed_blocks(c.layers, r));
    const double plain = blocks - ckpt;
    // What the models do with the chunk sizes (sana_blocks.cpp, sana_video_blocks.cpp): the
    // cross-attention runs its chunked kernel at any chunk, and so does the linear self-attention
    // (the video transformer's with its rotary positions). The feed-forward runs whole
    // when one chunk holds every row (image: a chunk of rows needs one row of halo on each side)
    // or frame (video: the temporal convolution runs after the chunks, on the D-wide result).
    const bool chunked = r.chunked_attention();
    const double dense = chunked ? 0.0 : 1.0;
    const double chunk = chunked ? static_cast<double>(std::min(r.attention_chunk, tokens)) : 0.0;
    const double self_whole = chunked ? 0.0 : 1.0;
    const double self_chunk = chunk;
    const int64_t ff_units = c.video ? c.frames : rows;
    const bool ff_chunked = r.ff_chunk_size > 0 && r.ff_chunk_size < ff_units;
    const double ff_whole = ff_chunked ? 0.0 : 1.0;
    const int64_t chunk_units =
        c.video ? r.ff_chunk_size * rows : std::min(r.ff_chunk_size + 2, rows);
    const double ff_tokens = ff_chunked ? static_cast<double>(chunk_units * row_tokens) : 0.0;
    return {
        1.0,
        plain * m * n * d,
        dense * plain * m * n * t * hc,
        plain * m * n * h,
        plain * m * n,
        self_whole * plain * m * n * d,
        ff_whole * plain * m * n * ff,
        ckpt * m * n * d,
        m * n * d,
        dense * m * n * t * hc,
        m * n * h,
        m * n,
        self_whole * m * n * d,
        ff_whole * m * n * ff,
        blocks * m * t * static_cast<double>(c.cross_inner),
        m * t * static_cast<double>(c.caption_channels),
        m * n * static_cast<double>(c.in_channels),
        batch * t * static_cast<double>(c.caption_channels),
        batch * n * static_cast<double>(c.in_channels),
        static_cast<double>(census.trainable),
        static_cast<double>(census.total),
        m * chunk * t * hc,
        m * self_chunk * d,
        m * ff_tokens * ff,
        blocks,
    };
}

double PhaseModel::eval(const std::vector<double>& x) const {
    double highest = 0;
    for (const Coefficients& c : planes) {
        if (c.size() != x.size()) {
            throw Error::InvalidArgument(fmt::format(
                "plan: a calibration with {} coefficients, not {} (made by another version: "
                "calibrate again)",
                c.size(), x.size()));
        }
        double y = 0;
        for (size_t i = 0; i < x.size(); ++i) y += c[i] * x[i];
        highest = std::max(highest, y);
    }
    return highest;
}

ParameterCensus device_share(const ParameterCensus& census, const PlanRemedies& r,
                             int64_t num_layers) {
    const int64_t swapped = std::clamp<int64_t>(r.blocks_to_swap, 0, num_layers);
    const int64_t away = swapped - lent_blocks(num_layers, r);
    ParameterCensus device = census;
    device.total -= away * census.block_total;
    device.trainable -= away * census.block_trainable;
    return device;
}

Footprint static_footprint(const ParameterCensus& census, const PlanRemedies& r,
                           int64_t num_layers) {
    const ParameterCensus device = device_share(census, r, num_layers);
    const int64_t swapped = std::clamp<int64_t>(r.blocks_to_swap, 0, num_layers);
    const int64_t swapped_state = swapped * census.block_state_bytes(r.optimizer);
    const int64_t state = census.state_bytes(r.optimizer);
    Footprint f;
    f.weights = device.total * 4;
    f.gradients = r.fused_backward ? 0 : device.trainable * 4;
    f.optimizer_state = r.offload_optimizer ? 0 : state - swapped_state;
    f.host = swapped * (census.block_total + census.block_trainable) * 4 +
             (r.offload_optimizer ? state : swapped_state);
    return f;
}

Footprint predict_footprint(const PlanShape& shape, const PlanRemedies& r,
                            const ParameterCensus& census, const PhaseModels& phases) {
    const int64_t layers = structure_of(shape).layers;
    const std::vector<double> x = step_features(shape, r, device_share(census, r, layers));
    Footprint f = static_footprint(census, r, layers);
    for (const auto& [phase, model] : phases) {
        const double rest = model.eval(x);
        const int64_t bytes = f.weights + f.optimizer_state + static_cast<int64_t>(rest);
        f.phase_peaks[phase] = bytes;
        if (bytes > f.peak) {
            f.peak = bytes;
            f.peak_phase = phase;
        }
    }
    return f;
}

std::string footprint_table(const Footprint& f) {
    std::string out = fmt::format("  {:<34} {:>12}\n", "weights (fp32)", format_bytes(f.weights));
    out += fmt::format("  {:<34} {:>12}\n", "gradients (trainable, fp32)",
                       f.gradients > 0 ? format_bytes(f.gradients) : "none live (fused)");
    out += fmt::format("  {:<34} {:>12}\n", "optimizer state", format_bytes(f.optimizer_state));
    if (f.host > 0) {
        out += fmt::format("  {:<34} {:>12}\n", "in host memory (swapped, offloaded)",
                           format_bytes(f.host));
    }
    out += fmt::format("  {:<34} {:>12} {:>30}\n", "phase", "peak", "activations and transients");
    for (const std::string phase : {"data", "forward", "backward", "optimizer"}) {
        const auto it = f.phase_peaks.find(phase);
        if (it == f.phase_peaks.end()) continue;
        const int64_t rest = it->second - f.weights - f.optimizer_state;
        out += fmt::format("  {:<34} {:>12} {:>30}{}\n", phase, format_bytes(it->second),
                           format_bytes(std::max<int64_t>(0, rest)),
                           phase == f.peak_phase ? "  <- peak" : "");
    }
    return out;
}

}  // namespace sf::plan
