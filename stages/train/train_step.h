// One optimizer step of a diffusion transformer (model/common/diffusion_transformer.h: the image
// or the video one), with every memory remedy as an option. The trainer (pipelines/train) and the
// memory ablation benchmark both drive this class, so what the benchmark measures is what
// training runs.
//
// A step: for each of `accumulation` micro-batches, load it (phase "data"), noise it and run the
// model under autocast (phase "forward"), backward the loss divided by `accumulation` (phase
// "backward"); then reduce across ranks (gradient_sync.h), unscale, check, clip and update (phase
// "optimizer"). With the fused backward
// pass each parameter is updated inside the last backward as soon as its gradient is complete,
// and its gradient freed at once, so full gradients never coexist.
//
// Memory is metered per phase: the peak of counted tensor bytes (CUDA allocator bytes on a GPU)
// and of the resident set, over all steps; the first `mark_steps` steps also mark the memory log
// after each phase. Running out of memory in a phase is an sf::Error kOutOfMemory that names the
// phase and the flags that would lower it, after gradients and caches are released.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/common/diffusion_transformer.h"
#include "stages/train/flow_matching.h"
#include "stages/train/gradient_sync.h"
#include "stages/train/optim.h"

namespace sf::train {

struct MicroBatch {
    at::Tensor latents;        // [B, C, h, w] or [B, C, f, h, w] clean latents (normalised)
    at::Tensor prompt_embeds;  // [B, L, caption_channels]
    at::Tensor prompt_mask;    // [B, L], 1 for a token; may be undefined
    // [B] fp32: each sample's loss multiplied by it (prior preservation: prior_pairs.h); may be
    // undefined (all 1).
    at::Tensor sample_weights = at::Tensor();
};

struct TrainStepOptions {
    std::string mixed_precision = "no";  // "no", "bf16", "fp16": autocast dtype; weights stay fp32
    int64_t gradient_checkpointing = 0;  // 0 off; k: every k-th block recomputed in backward
    std::string attention = "dense";     // cross-attention: "dense", "chunked", "fused"
    int64_t attention_chunk = 1024;      // query rows per chunk for "chunked"
    int64_t ff_chunk_size = 0;  // feed-forward over k latent rows (image) or frames (video)
    int64_t accumulation = 1;   // micro-batches per optimizer step
    // Each micro-batch as this many passes over parts of it (at most one sample each), their
    // gradients added: the samples, noise and gradients of the whole micro-batch (up to the order
    // of the sums) with the activations of a part. What --auto_fit raises first.
    int64_t micro_batch_split = 1;
    bool fused_backward = false;  // update each parameter inside the backward pass
    // The first N blocks' weights kept in host memory and lent to the device for each run of the
    // block (model/common/block_swap.h); their update runs where they are kept.
    int64_t blocks_to_swap = 0;
    double max_grad_norm = 0;     // global-norm clipping; 0 = off
    bool loss_scaling = false;    // dynamic loss scaling (on by default for fp16)
    int64_t mark_steps = 2;       // steps whose phases are marked in the memory log
    bool keep_gradients = false;  // leave .grad after the step, for inspection (not fused)
    FlowMatchingConfig flow;
    // Video windows (more than one latent frame) only: the chance that a micro-batch is an
    // image-to-video one (latent frame 0 clean at timestep 0, out of the loss), drawn from the
    // step's generator; and the latent frames where timestep chunks start (flow_matching.h).
    double i2v_probability = 0;
    std::vector<int64_t> chunk_starts;
};

struct StepResult {
    int64_t step = 0;  // optimizer steps taken or skipped so far, this one included
    double loss = 0;   // mean of the micro-batch losses
    double lr = 0;
    double grad_norm = 0;  // before clipping; 0 when not computed (no clipping, fused)
    // Prodigy: its step size after this step, d x lr (what moves the weights); 0 with AdamW.
    double prodigy_d_lr = 0;
    bool skipped = false;  // the loss scaler found a non-finite gradient
    double loss_scale = 1;
};

struct PhasePeak {
    int64_t tensor_bytes = 0;  // counted CPU bytes, or CUDA allocator bytes on a GPU
    int64_t rss_bytes = 0;
};

// The samples of a micro-batch of `batch` that rank `rank` of `world_size` computes: a contiguous
// run [first, first + count) (every rank draws the whole micro-batch's noise, so N ranks see
// exactly what one rank with the whole micro-batch sees), its loss weighted by `weight`.
struct RankShare {
    int64_t first = 0, count = 0;
    double weight = 1.0;
};
RankShare rank_share(int64_t batch, int rank, int world_size);

// c10::OutOfMemoryError (a CUDA allocation, or the CPU byte budget) or sf::Error kOutOfMemory.
bool is_out_of_memory(const std::exception& e);

class TrainStep {
public:
    // `trainable`: name -> parameter of `model` to update (all of them for full fine-tuning, the
    // adapters for LoRA). Validates the options: kInvalidArgument naming the flag, e.g. for the
    // fused backward pass together with global-norm clipping, fp16 loss scaling or Prodigy, which
    // need every gradient before the first update. `adamw.prodigy.enabled` builds Prodigy.
    // `sync`: the data-parallel reduction; null for one process.
    TrainStep(std::shared_ptr<model::DiffusionTransformer> model,
              std::vector<std::pair<std::string, at::Tensor>> trainable, AdamWOptions adamw,
              LRSchedule schedule, TrainStepOptions options, c10::Device device,
              std::shared_ptr<GradientSync> sync = nullptr);
    ~TrainStep();
    TrainStep(const TrainStep&) = delete;
    TrainStep& operator=(const TrainStep&) = delete;

    // One optimizer step over options.accumulation micro-batches, load(k) giving the k-th.
    StepResult step(const std::function<MicroBatch(int64_t k)>& load, at::Generator& gen);

    // After a step failed with kOutOfMemory: whether it left the weights and the optimizer as
    // they were (true unless AdamW had begun: the optimizer phase, or the fused pass), so that
    // the caller may restore its data and generator and run the step again.
    bool retryable() const { return retryable_; }
    // Takes the micro-batch split, checkpointing, attention and feed-forward chunk of `o` (the
    // rest must be the current options'), for the steps from now on.
    void adapt(const TrainStepOptions& o);

    int64_t steps_done() const { return step_; }
    void set_steps_done(int64_t step) { step_ = step; }
    Optimizer& optimizer() { return *optimizer_; }
    // The AdamW that updates (kInvalidArgument under Prodigy): its offload and overlap counts.
    AdamW& adamw();
    // The whole optimizer state for a checkpoint: Optimizer::state(), gathered from every rank
    // when it is sharded (complete on rank 0). Every rank must call it.
    std::map<std::string, at::Tensor> optimizer_state() {
        return sync_->gather_state(optimizer_->state());
    }
    LossScaler& scaler() { return scaler_; }
    const TrainStepOptions& options() const { return options_; }
    model::DiffusionTransformer& model() { return *model_; }
    GradientSync& gradient_sync() { return *sync_; }

    // phase ("data", "forward", "backward", "optimizer", and "validation" when the run samples)
    // -> its peak over every step so far.
    const std::map<std::string, PhasePeak>& phase_peaks() const { return peaks_; }
    // A phase of the run outside the step (validation), measured by the caller: kept as the
    // step's own phases are, the highest seen.
    void add_phase_peak(const std::string& phase, const PhasePeak& peak);
    std::string phase_table() const;

private:
    class GradReadyHooks;
    class FusedUpdate;
    // How this micro-batch's timesteps are laid out (per sample, chunks, image-to-video).
    FrameTimesteps frame_timesteps(const MicroBatch& mb, at::Generator& gen) const;
    // The forward and backward passes over one micro-batch (in parts under micro_batch_split, on
    // this rank's share of it), `phase` naming the one running; adds the loss, detached, to
    // `loss_sum`. The fused pass updates in the backward of the last micro-batch. Frees the
    // micro-batch's inputs.
    void forward_backward(MicroBatch& mb, const NoisedBatch& noised, bool last_micro_batch,
                          double lr, at::Tensor& loss_sum, std::string& phase);
    // The optimizer phase: gradients reduced, unscaled, clipped, AdamW's update, the updates
    // shared with the other ranks.
    void update(StepResult& result);
    void begin_phase();
    void end_phase(const std::string& phase);
    [[noreturn]] void out_of_memory(const std::string& phase, const std::string& what);
    void apply_model_remedies();
    std::string remedies_for(const std::string& phase) const;

    std::shared_ptr<model::DiffusionTransformer> model_;
    std::shared_ptr<GradientSync> sync_;
    std::vector<at::Tensor> params_;
    std::unique_ptr<Optimizer> optimizer_;
    AdamW* adamw_ = nullptr;  // optimizer_, when it is AdamW
    LRSchedule schedule_;
    TrainStepOptions options_;
    c10::Device device_;
    c10::ScalarType autocast_dtype_ = c10::kFloat;  // from options_.mixed_precision
    LossScaler scaler_;
    std::unique_ptr<FusedUpdate> fused_;
    std::unique_ptr<GradReadyHooks> sync_ready_;  // when the sync reduces during the backward
    int64_t step_ = 0;
    std::map<std::string, PhasePeak> peaks_;
    double phase_begin_ = 0;  // mem::process_seconds() when the current phase began
    bool retryable_ = true;
};

}  // namespace sf::train
