// What one training step of a Sana transformer (the image one, SanaTransformer2DModel, or the
// video one, SanaVideoTransformer3DModel) holds at its peak, predicted from the model's
// structure: `sanaflow plan` and `--auto_fit` ask it before anything is allocated.
//
// The static part is counted exactly from the configuration: the weights (fp32), the gradients
// of the trainable parameters (none live together under the fused backward pass) and AdamW's
// state (fp32 or 8-bit moments, per tensor as optim.h keeps them). The rest of each phase's peak
// (activations saved for backward, the largest transient, the inputs) is a sum of structural
// terms, each the element count of a kind of tensor the step holds: per block the token-wide
// activations (m x N x D), the dense cross-attention scores (m x N x T x heads), the caption
// keys and values, one block's recompute under checkpointing, one chunk's scores or hidden rows
// under the chunked paths, the weights' low-precision copies under autocast, and so on
// (step_features()). How many bytes each term costs is measured, not guessed: calibration.h runs
// real steps of tiny configurations on the target device and fits the coefficients.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/common/diffusion_transformer.h"
#include "model/sana/sana_config.h"
#include "model/sana_video/sana_video_config.h"

namespace sf::plan {

// The flags that change what a step holds, as the trainer spells them.
struct PlanRemedies {
    std::string mixed_precision = "no";  // "no" or "bf16" (fp16 holds the same)
    int64_t gradient_checkpointing = 0;  // 0 off; k: every k-th block recomputed
    std::string attention = "dense";     // "dense", "chunked", "fused"
    int64_t attention_chunk = 1024;      // tokens per chunk of the chunked attentions
    int64_t ff_chunk_size = 0;           // latent rows per feed-forward chunk; 0: whole
    bool fused_backward = false;
    int64_t accumulation = 1;         // micro-batches per optimizer step: batch / accumulation each
    int64_t micro_batch_split = 1;    // passes per micro-batch (what a pass holds is counted)
    std::string optimizer = "adamw";  // "adamw" or "adamw8bit"
    int64_t blocks_to_swap = 0;       // the first N blocks' weights in host memory
    bool offload_optimizer = false;   // AdamW's moments in host memory

    bool chunked_attention() const { return attention != "dense"; }
    // What a calibration is kept under: the remedies that change which tensors a block holds
    // (the sizes, such as the chunk or the micro-batch, are features, not keys).
    std::string key(bool lora) const;
    // The command-line flags that turn these remedies on (empty for none).
    std::string flags() const;
    // What the calibration measures for these remedies. Block swap and optimizer offload move
    // bytes that are counted exactly to the host (device_share() takes them off), and a swapped
    // block is always checkpointed: beside checkpointing, swap changes nothing else, so its
    // calibration is checkpointing's. Swap alone checkpoints the swapped blocks only: that is
    // calibrated by steps that swap (blocks_to_swap = 1 here, any count in the steps).
    PlanRemedies calibrated() const;
};

// The swapped blocks on the device at a step's peak under r's block swap: when every block is
// recomputed (the peak is inside a recompute, and for a swapped block that holds it and the one
// copied ahead: model/common/block_swap.h) two, else none (the peak is at the backward of a block
// that keeps its activations, before any swapped block is lent again). Counted exactly, with the
// weights the device keeps; at other moments fewer are there, so this errs high.
int64_t lent_blocks(int64_t num_layers, const PlanRemedies& r);

// The blocks of `num_layers` that a step recomputes: every k-th (r.gradient_checkpointing) and
// the swapped ones.
int64_t checkpointed_blocks(int64_t num_layers, const PlanRemedies& r);

struct PlanShape {
    model::SanaTransformerConfig config;  // the image transformer's, unless `video` is set
    // The video transformer (SanaVideoTransformer3DModel) instead: its latents are windows of
    // `latent_frames` frames.
    std::optional<model::SanaVideoTransformerConfig> video;
    int64_t latent_frames = 1;
    // The latent grid: pixels / 32 for DC-AE, / 8 for the Wan VAE.
    int64_t latent_height = 32, latent_width = 32;
    int64_t batch = 1;  // samples per optimizer step
    // Samples each drawn item brings: 2 under prior preservation (an instance and a class
    // sample), so a micro-batch holds a multiple of it.
    int64_t samples_per_item = 1;
    int64_t caption_tokens = 300;
    int64_t lora_rank = 0;  // 0: full fine-tune
    std::vector<std::string> lora_targets = {"to_q", "to_k", "to_v"};
};

// The numbers of the transformer that the prediction reads, of whichever the shape holds.
struct Structure {
    bool video = false;
    int64_t layers = 0, inner = 0, ff = 0, heads = 0, cross_heads = 0, cross_inner = 0;
    int64_t caption_channels = 0, in_channels = 0;
    int64_t patch_frames = 1, patch_height = 1, patch_width = 1;
    int64_t frames = 1, rows = 0, row_tokens = 0;  // of patches
    int64_t tokens() const { return frames * rows * row_tokens; }
};
Structure structure_of(const PlanShape& shape);
// The shape with `layers` blocks (its transformer's other numbers as they are).
PlanShape with_layers(PlanShape shape, int64_t layers);
// [batch, C, h, w] for the image transformer, [batch, C, frames, h, w] for the video one.
std::vector<int64_t> latent_sizes(const PlanShape& shape);
// The shape's transformer, seeded as it comes (with its LoRA adapters when lora_rank > 0).
std::shared_ptr<model::DiffusionTransformer> build_transformer(const PlanShape& shape);

// The parameters of a configuration, counted exactly: all, the trainable ones, and AdamW's state.
struct ParameterCensus {
    int64_t total = 0;
    int64_t trainable = 0;
    int64_t adamw_state_bytes = 0;      // two fp32 moments per trainable element
    int64_t adamw8bit_state_bytes = 0;  // codes and absmax per block (fp32 below kMin8BitSize)
    // Prodigy's moments, s and p0 (a scalar for a tensor that starts at zero: LoRA's B).
    int64_t prodigy_state_bytes = 0;
    int64_t largest_trainable = 0;  // elements of the largest trainable tensor
    // What one transformer block adds to each count (the blocks are alike).
    int64_t block_total = 0, block_trainable = 0;
    int64_t block_adamw_state_bytes = 0, block_adamw8bit_state_bytes = 0;
    int64_t block_prodigy_state_bytes = 0;
    int64_t state_bytes(const std::string& optimizer) const;
    int64_t block_state_bytes(const std::string& optimizer) const;
};

// What of `census` the device holds at the peak with r's block swap (all but the swapped blocks,
// and lent_blocks() of those), and the static part of a footprint: the device's weights,
// gradients and optimizer state (none offloaded; a swapped block's is on the host either way) and
// the host's.
struct Footprint;
ParameterCensus device_share(const ParameterCensus& census, const PlanRemedies& r,
                             int64_t num_layers);
Footprint static_footprint(const ParameterCensus& census, const PlanRemedies& r,
                           int64_t num_layers);

// Builds the configuration with one and with two blocks (never the whole model: the blocks are
// alike, so every count is linear in their number) and counts what a run would train.
ParameterCensus count_parameters(const PlanShape& shape);

// The structural terms of a step, in elements (kFeatureNames says what each counts).
std::vector<double> step_features(const PlanShape& shape, const PlanRemedies& r,
                                  const ParameterCensus& census);
extern const std::vector<std::string> kFeatureNames;

// Bytes per element of each feature.
using Coefficients = std::vector<double>;

// One phase's peak beyond the static part: the highest of one or two planes. A phase can peak at
// two moments (the backward at its start, when every saved activation is still held, or at its
// end, when every gradient is), and which one is higher depends on the shape.
struct PhaseModel {
    std::vector<Coefficients> planes;
    double eval(const std::vector<double>& x) const;
};
using PhaseModels = std::map<std::string, PhaseModel>;  // phase -> model

struct Footprint {
    int64_t weights = 0, gradients = 0, optimizer_state = 0;  // on the device
    // In host memory: the swapped blocks' weights and gradients, the offloaded moments.
    int64_t host = 0;
    std::map<std::string, int64_t> phase_peaks;  // "data", "forward", "backward", "optimizer"
    int64_t peak = 0;
    std::string peak_phase;
};

// The prediction of every phase fitted in `phases` (phase -> coefficients), the static part
// added. With r.blocks_to_swap = N, the device holds the weights (and gradients) of the other
// blocks and of the lent ones; with r.offload_optimizer, no optimizer state (a swapped block's
// state is on the host either way).
Footprint predict_footprint(const PlanShape& shape, const PlanRemedies& r,
                            const ParameterCensus& census, const PhaseModels& phases);

// The footprint as a table: the static part, then each phase's peak ("<- peak" at the highest).
std::string footprint_table(const Footprint& f);

}  // namespace sf::plan
