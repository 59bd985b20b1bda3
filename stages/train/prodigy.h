// Prodigy (Mishchenko and Defazio, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner"):
// Adam whose step size D is estimated as training goes, so --learning_rate is a multiplier on it
// (about 1.0) rather than a step size. Written out as prodigyopt 1.x's Prodigy.step computes it,
// op for op, with one parameter group and slice_p 1 (what diffusers' scripts construct):
//
//   dlr = d lr bc            bc = sqrt(1 - beta2^(k+1)) / (1 - beta1^(k+1)) with bias correction
//   numerator <- beta3 numerator + sum_p (d / d0) dlr <g_p, p0_p - p>
//   m <- beta1 m + d (1 - beta1) g          v <- beta2 v + d^2 (1 - beta2) g^2
//   s <- beta3 s + (d / d0) d g   (safeguard_warmup; else (d / d0) dlr g)
//   d_hat = d_coef numerator / sum_p |s_p|_1;  d grows to max(d, d_hat) (first step), bounded by
//           the largest d_hat seen and growth_rate
//   p <- p - dlr wd p (decoupled) - dlr m / (sqrt(v) + d eps)
//
// p0 is each parameter's value at its first step (a scalar 0 for a parameter that is all zeros,
// as prodigyopt saves the memory: LoRA's B matrices), so the state is four tensors per parameter.
// Every parameter's gradient is needed before the first update (the D estimate sums over all of
// them): no fused backward pass, no 8-bit or offloaded state. Under ZeRO-1 each rank steps the
// parameters it owns, and the estimate's two sums are added up over the ranks (set_rank_sum), so
// every rank holds the same d.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stages/train/optim.h"

namespace sf::train {

class Prodigy : public Optimizer {
public:
    // `options.prodigy` holds Prodigy's own settings; lr, betas, eps and weight decay are the
    // AdamW flags', as upstream passes them. kInvalidArgument naming the flag for a bad value.
    Prodigy(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options);

    void step(double lr) override;
    // The parameters' tensors by "<param>.exp_avg", ".exp_avg_sq", ".s", ".p0" and ".step", and
    // the estimate as 0-d tensors: "prodigy.d", "prodigy.d_max", "prodigy.d_numerator" (fp64)
    // and "prodigy.k" (int64, steps taken).
    std::map<std::string, at::Tensor> state() const override;
    void load_state(const std::map<std::string, at::Tensor>& state) override;
    // ZeRO-1: the parameters of other ranks are not stepped and keep no state.
    void set_owned(std::vector<bool> owned) override;
    // With the parameters spread over ranks: adds up a value over the ranks (every rank calls it
    // with its part). Without: the sums are this process's.
    void set_rank_sum(std::function<double(double)> sum) { rank_sum_ = std::move(sum); }

    double d() const { return d_; }
    double d_max() const { return d_max_; }

private:
    struct PerParam {
        at::Tensor exp_avg, exp_avg_sq, s, p0;
        int64_t step = 0;
    };
    AdamWOptions options_;
    std::function<double(double)> rank_sum_;
    double beta3_;
    std::vector<PerParam> state_;
    double d_, d_max_, d_numerator_ = 0;
    int64_t k_ = 0;
};

}  // namespace sf::train
