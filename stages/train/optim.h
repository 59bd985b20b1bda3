// What the trainer updates weights with: AdamW (or Prodigy, prodigy.h, behind the same
// Optimizer interface), the learning-rate schedules of diffusers' get_scheduler, global
// gradient-norm clipping and a dynamic loss scaler for fp16.
//
// AdamW is written out rather than taken from torch::optim because the fused backward pass
// updates one parameter at a time, as soon as its gradient is complete (step_one), and because
// checkpoints need its state by parameter name. Its arithmetic is torch::optim::AdamW's, op for
// op, so the two agree bit for bit (tested).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stages/train/host_worker.h"
#include "stages/train/quantized_state.h"

namespace sf::train {

// Prodigy's own settings (prodigyopt's Prodigy, as diffusers' scripts construct it: their
// --prodigy_* flags and defaults); lr, betas, eps and weight decay are AdamWOptions'.
struct ProdigyOptions {
    bool enabled = false;  // --optimizer prodigy
    double beta3 = 0;      // 0: sqrt(beta2), as prodigyopt's None
    bool decouple = true;  // AdamW-style weight decay (else added to the gradient)
    bool use_bias_correction = true;
    bool safeguard_warmup = true;  // lr out of the D estimate's denominator
    double d0 = 1e-6;              // the initial D estimate
    double d_coef = 1.0;
    double growth_rate = 0;  // 0: unbounded (prodigyopt's inf)
};

struct AdamWOptions {
    double lr = 1e-4;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 1e-2;
    // The moments in 8 bits, blockwise (quantized_state.h; --optimizer adamw8bit): a quarter of
    // the memory. Each update reads them back to fp32 for one parameter at a time.
    bool eight_bit = false;
    // --offload_optimizer: the moments in host memory and the update run there: each parameter's
    // gradient and weights copied to the host, updated beside the moments, the weights copied
    // back (real copies on the CPU too, so that path is the one CUDA takes). Under the fused
    // backward pass the update runs beside the backward (step_one_overlapped).
    bool offload = false;
    // Prodigy instead of AdamW (TrainStep builds a Prodigy when enabled).
    ProdigyOptions prodigy;
};

// What TrainStep updates the weights with: the parameters by name, their state for checkpoints.
class Optimizer {
public:
    // `params`: name -> trainable tensor (requires_grad), in a fixed order.
    explicit Optimizer(std::vector<std::pair<std::string, at::Tensor>> params)
        : params_(std::move(params)) {}
    virtual ~Optimizer() = default;
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // Updates every parameter that has a gradient, with learning rate `lr`.
    virtual void step(double lr) = 0;
    // The state by name, for checkpoints; load_state restores it (kInvalidArgument naming a
    // missing or misshaped entry).
    virtual std::map<std::string, at::Tensor> state() const = 0;
    virtual void load_state(const std::map<std::string, at::Tensor>& state) = 0;
    // ZeRO-1: only the parameters marked true are updated here and keep state; every one by
    // default.
    virtual void set_owned(std::vector<bool> owned);
    bool owns(size_t index) const { return owned_.empty() || owned_[index]; }

    void zero_grad();  // drops the gradients (sets them undefined: no memory kept)
    void drop_grad(size_t index);
    size_t size() const { return params_.size(); }
    const std::string& name(size_t index) const { return params_[index].first; }
    const at::Tensor& param(size_t index) const { return params_[index].second; }

protected:
    std::vector<std::pair<std::string, at::Tensor>> params_;
    std::vector<bool> owned_;  // empty: all
};

class AdamW : public Optimizer {
public:
    AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options);

    void step(double lr) override;
    // Updates parameter `index` alone from its current gradient (the fused backward pass).
    void step_one(size_t index, double lr);
    // step_one, but with --offload_optimizer the host update and the copy back run on a worker
    // thread (the gradient and weights are copied to the host now, so the gradient may be dropped
    // at once): the fused backward pass computes the blocks before this one meanwhile. The
    // parameter must not be read until wait(). Without offload, step_one.
    void step_one_overlapped(size_t index, double lr);
    // Returns once every overlapped update is done; rethrows the first one's error.
    void wait();
    // Updates handed to the worker by step_one_overlapped so far.
    int64_t overlapped_updates() const { return overlapped_; }
    // step_one and load_state leave the parameters of other ranks alone.
    void set_owned(std::vector<bool> owned) override;

    const AdamWOptions& options() const { return options_; }
    // Tensors copied between the device and the host by --offload_optimizer so far.
    int64_t offload_copies() const { return offload_copies_; }

    // State by name: "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step" (a 0-d int64); in
    // 8 bits "<param>.exp_avg.codes" (uint8) and "<param>.exp_avg.absmax" (fp32), likewise for
    // exp_avg_sq.
    std::map<std::string, at::Tensor> state() const override;
    void load_state(const std::map<std::string, at::Tensor>& state) override;

private:
    void run_step(size_t index, double lr, bool overlapped);
    void update(size_t index, double lr, at::Tensor p, const at::Tensor& grad);

    struct Moments {
        at::Tensor exp_avg, exp_avg_sq;  // fp32
        BlockQuantized avg8, avg_sq8;    // eight_bit
        int64_t step = 0;
    };
    std::vector<Moments> moments_;
    AdamWOptions options_;
    int64_t offload_copies_ = 0;
    int64_t overlapped_ = 0;
    std::unique_ptr<HostWorker> worker_;  // the overlapped updates', made by the first
};

// diffusers' get_scheduler: "constant", "constant_with_warmup", "linear", "cosine" (half a cosine
// from the peak to zero after the warmup), "cosine_with_restarts" (`num_cycles` hard restarts)
// and "polynomial" (to diffusers' lr_end 1e-7 with `power`). Validated when built
// (kInvalidArgument naming --lr_scheduler, --lr_num_cycles or --lr_power).
class LRSchedule {
public:
    LRSchedule(std::string kind, double base_lr, int64_t warmup_steps, int64_t total_steps,
               int64_t num_cycles = 1, double power = 1.0);
    // The learning rate of optimizer step `step` (0-based), as the scheduler gives it after
    // `step` calls to scheduler.step().
    double at(int64_t step) const;
    const std::string& kind() const { return kind_; }

private:
    std::string kind_;
    double base_lr_;
    int64_t warmup_, total_;
    int64_t num_cycles_;
    double power_;
};

// torch.nn.utils.clip_grad_norm_: scales every gradient so that their global L2 norm is at most
// max_norm; returns the norm before clipping (inf or nan when a gradient is not finite). With the
// gradients spread over ranks (ZeRO-1), `sum_over_ranks` adds up each rank's squared norm.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const std::function<double(double)>& sum_over_ranks = nullptr);

// Dynamic loss scaling for fp16, as torch.cuda.amp.GradScaler does it: the loss is multiplied by
// the scale before backward; before the optimizer step the gradients are divided by it and
// checked; a step with any inf or nan gradient is skipped and the scale multiplied by
// backoff_factor, and after growth_interval clean steps in a row it is multiplied by
// growth_factor.
struct LossScalerOptions {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
};

class LossScaler {
public:
    explicit LossScaler(bool enabled, LossScalerOptions options = {});

    bool enabled() const { return enabled_; }
    double scale() const { return enabled_ ? scale_ : 1.0; }
    at::Tensor scale_loss(const at::Tensor& loss) const;
    // Divides the gradients by the scale; false when any is not finite (the step must be skipped).
    bool unscale(const std::vector<at::Tensor>& params) const;
    // After the step (taken or skipped): adapts the scale.
    void update(bool found_inf);
    int64_t skipped_steps() const { return skipped_; }

    // scale, growth tracker and skipped count, for checkpoints.
    std::map<std::string, double> state() const;
    void load_state(const std::map<std::string, double>& state);

private:
    bool enabled_;
    LossScalerOptions options_;
    double scale_;
    int64_t good_steps_ = 0;
    int64_t skipped_ = 0;
};

}  // namespace sf::train
