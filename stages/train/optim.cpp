#include "stages/train/optim.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/check.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace sf::train {

// diffusers' get_polynomial_decay_schedule_with_warmup: lr_end.
constexpr double kPolynomialEndLr = 1e-7;
// Host copies of weights and gradients waiting for the overlapped updates: past this the backward
// waits for the worker instead of queuing more (a whole model's copies, otherwise, when the
// host's arithmetic is the slower side).
constexpr int64_t kMaxPendingHostBytes = int64_t{1} << 30;

void Optimizer::set_owned(std::vector<bool> owned) {
    SF_CHECK(owned.size() == params_.size(), "an ownership mask of the wrong length");
    owned_ = std::move(owned);
}

void Optimizer::zero_grad() {
    for (auto& [name, p] : params_) p.mutable_grad() = at::Tensor();
}

void Optimizer::drop_grad(size_t index) { params_[index].second.mutable_grad() = at::Tensor(); }

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options)
    : Optimizer(std::move(params)), moments_(params_.size()), options_(options) {
    if (options_.lr < 0)
        throw Error::InvalidArgument(
            fmt::format("--learning_rate must be >= 0, got {}", options_.lr));
    if (options_.beta1 < 0 || options_.beta1 >= 1 || options_.beta2 < 0 || options_.beta2 >= 1) {
        throw Error::InvalidArgument("--adam_beta1 and --adam_beta2 must be in [0, 1)");
    }
    if (options_.eps <= 0) throw Error::InvalidArgument("--adam_epsilon must be > 0");
    if (options_.weight_decay < 0) throw Error::InvalidArgument("--adam_weight_decay must be >= 0");
}

void AdamW::step(double lr) {
    for (size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].second.grad().defined()) step_one(i, lr);
    }
}

void AdamW::step_one(size_t index, double lr) { run_step(index, lr, /*overlapped=*/false); }

void AdamW::step_one_overlapped(size_t index, double lr) {
    run_step(index, lr, /*overlapped=*/true);
}

void AdamW::run_step(size_t index, double lr, bool overlapped) {
    at::NoGradGuard no_grad;
    const at::Tensor& param = params_[index].second;
    if (!param.grad().defined() || !owns(index)) return;
    if (!options_.offload) {
        update(index, lr, param, param.grad());
        return;
    }
    // Offloaded, the arithmetic runs on host copies (core/host_memory.h), made now while the
    // gradient exists; the weights go back after it. Overlapped, the update and the copy back
    // run on the worker: nothing reads this parameter until wait(), as its gradient is complete
    // and the rest of the backward pass does not use it.
    const at::Tensor p = mem::to_host(param.detach(), false);
    const at::Tensor grad = mem::to_host(param.grad(), false);
    offload_copies_ += 3;
    auto job = [this, index, lr, p, grad, param] {
        at::NoGradGuard no_grad;
        update(index, lr, p, grad);
        param.detach().copy_(p);
    };
    if (!overlapped) return job();
    ++overlapped_;
    if (!worker_) worker_ = std::make_unique<HostWorker>(kMaxPendingHostBytes);
    worker_->submit(std::move(job), p.nbytes() + grad.nbytes());
}

void AdamW::wait() {
    if (worker_) worker_->wait();
}

// torch::optim::AdamW::step (LibTorch 1.13) for one parameter, in the same order of operations:
// `p` is the parameter's data or its host copy, `grad` its gradient or the gradient's. A block
// swap's weights are in host memory already, and so are their moments.
void AdamW::update(size_t index, double lr, at::Tensor p, const at::Tensor& grad) {
    const bool host = options_.offload || mem::in_host_memory(p);
    Moments& m = moments_[index];
    if (options_.weight_decay != 0) p.mul_(1 - lr * options_.weight_decay);
    const bool eight_bit = options_.eight_bit && p.numel() >= kMin8BitSize;
    if (eight_bit) {
        // Read back, updated as in fp32, stored again: only this parameter's moments are fp32.
        if (m.avg8.defined()) {
            m.exp_avg = m.avg8.dequantize(p);
            m.exp_avg_sq = m.avg_sq8.dequantize(p);
        }
    }
    if (!m.exp_avg.defined()) {
        m.exp_avg = host ? mem::host_zeros_like(p) : at::zeros_like(p, at::MemoryFormat::Preserve);
        m.exp_avg_sq =
            host ? mem::host_zeros_like(p) : at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    ++m.step;
    const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(m.step));
    const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(m.step));
    m.exp_avg.mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    m.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    const at::Tensor denom = (m.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    p.addcdiv_(m.exp_avg, denom, -(lr / bias_correction1));
    if (eight_bit) {
        m.avg8 = BlockQuantized::quantize(m.exp_avg, /*is_signed=*/true);
        m.avg_sq8 = BlockQuantized::quantize(m.exp_avg_sq, /*is_signed=*/false);
        if (host) {
            for (BlockQuantized* q : {&m.avg8, &m.avg_sq8}) {
                q->codes = mem::to_host(q->codes, false);
                q->absmax = mem::to_host(q->absmax, false);
            }
        }
        m.exp_avg = m.exp_avg_sq = at::Tensor();
    }
}

void AdamW::set_owned(std::vector<bool> owned) {
    Optimizer::set_owned(std::move(owned));
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!owns(i)) moments_[i] = Moments{};
    }
}

std::map<std::string, at::Tensor> AdamW::state() const {
    std::map<std::string, at::Tensor> out;
    for (size_t i = 0; i < params_.size(); ++i) {
        const Moments& m = moments_[i];
        const std::string& name = params_[i].first;
        if (m.avg8.defined()) {
            out[name + ".exp_avg.codes"] = m.avg8.codes;
            out[name + ".exp_avg.absmax"] = m.avg8.absmax;
            out[name + ".exp_avg_sq.codes"] = m.avg_sq8.codes;
            out[name + ".exp_avg_sq.absmax"] = m.avg_sq8.absmax;
            out[name + ".step"] = at::scalar_tensor(m.step, at::kLong);
            continue;
        }
        if (!m.exp_avg.defined()) continue;  // never stepped
        out[name + ".exp_avg"] = m.exp_avg;
        out[name + ".exp_avg_sq"] = m.exp_avg_sq;
        out[name + ".step"] = at::scalar_tensor(m.step, at::kLong);
    }
    return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& state) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
        const auto& [name, p] = params_[i];
        auto step = state.find(name + ".step");
        if (step == state.end() || !owns(i)) {  // never stepped, or another rank's (ZeRO-1)
            moments_[i] = Moments{};
            continue;
        }
        Moments m;
        m.step = step->second.item<int64_t>();
        // Where the moments live: beside the weights, or in host memory when offloaded (or when
        // the weights are there, swapped).
        const bool host = options_.offload || mem::in_host_memory(p);
        auto place = [&](const at::Tensor& t, at::ScalarType dtype) {
            return host ? mem::to_host(t.to(dtype), false) : t.to(p.device(), dtype).clone();
        };
        if (options_.eight_bit && p.numel() >= kMin8BitSize) {
            const int64_t blocks = (p.numel() + kQuantBlock - 1) / kQuantBlock;
            for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
                auto codes = state.find(name + which + ".codes");
                auto absmax = state.find(name + which + ".absmax");
                if (codes == state.end() || absmax == state.end() ||
                    codes->second.numel() != p.numel() || absmax->second.numel() != blocks ||
                    codes->second.scalar_type() != at::kByte) {
                    throw Error::InvalidArgument(fmt::format(
                        "optimizer state: {}{} is missing, misshaped or not 8-bit (a checkpoint of "
                        "--optimizer adamw resumes with adamw only)",
                        name, which));
                }
                const bool first = std::string(which) == ".exp_avg";
                BlockQuantized& q = first ? m.avg8 : m.avg_sq8;
                q.is_signed = first;
                q.codes = place(codes->second.reshape({-1}), at::kByte);
                q.absmax = place(absmax->second.reshape({-1}), at::kFloat);
            }
            moments_[i] = std::move(m);
            continue;
        }
        for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
            auto it = state.find(name + which);
            if (it == state.end() || !it->second.sizes().equals(p.sizes())) {
                throw Error::InvalidArgument(fmt::format(
                    "optimizer state: {}{} is missing or has the wrong shape", name, which));
            }
            at::Tensor t = place(it->second, p.scalar_type());
            (std::string(which) == ".exp_avg" ? m.exp_avg : m.exp_avg_sq) = t;
        }
        moments_[i] = std::move(m);
    }
}

LRSchedule::LRSchedule(std::string kind, double base_lr, int64_t warmup_steps, int64_t total_steps,
                       int64_t num_cycles, double power)
    : kind_(std::move(kind)),
      base_lr_(base_lr),
      warmup_(warmup_steps),
      total_(total_steps),
      num_cycles_(num_cycles),
      power_(power) {
    static const char* const kinds[] = {"constant", "constant_with_warmup", "linear",
                                        "cosine",   "cosine_with_restarts", "polynomial"};
    if (std::find(std::begin(kinds), std::end(kinds), kind_) == std::end(kinds)) {
        throw Error::InvalidArgument(fmt::format("--lr_scheduler must be one of {}, got '{}'",
                                                 fmt::join(kinds, ", "), kind_));
    }
    if (warmup_ < 0) throw Error::InvalidArgument("--lr_warmup_steps must be >= 0");
    if (total_ < 1) throw Error::InvalidArgument("--max_train_steps must be >= 1");
    if (num_cycles_ < 1) throw Error::InvalidArgument("--lr_num_cycles must be >= 1");
    if (!std::isfinite(power_) || power_ <= 0)
        throw Error::InvalidArgument("--lr_power must be a finite number > 0");
    if (kind_ == "polynomial" && !(base_lr_ > kPolynomialEndLr)) {
        throw Error::InvalidArgument(fmt::format(
            "--lr_scheduler polynomial decays to {:g}: --learning_rate must be larger, got {:g}",
            kPolynomialEndLr, base_lr_));
    }
}

double LRSchedule::at(int64_t step) const {
    if (kind_ == "constant") return base_lr_;
    if (step < warmup_)
        return base_lr_ * static_cast<double>(step) /
               static_cast<double>(std::max<int64_t>(1, warmup_));
    if (kind_ == "constant_with_warmup") return base_lr_;
    if (kind_ == "polynomial") {
        if (step > total_) return kPolynomialEndLr;
        const double remaining =
            1.0 - static_cast<double>(step - warmup_) /
                      static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
        return (base_lr_ - kPolynomialEndLr) * std::pow(remaining, power_) + kPolynomialEndLr;
    }
    const double progress = static_cast<double>(step - warmup_) /
                            static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
    if (kind_ == "linear") return base_lr_ * std::max(0.0, 1.0 - progress);
    if (kind_ == "cosine_with_restarts") {
        if (progress >= 1.0) return 0.0;
        const double cycle = std::fmod(static_cast<double>(num_cycles_) * progress, 1.0);
        return base_lr_ * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * cycle)));
    }
    return base_lr_ * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));  // num_cycles 0.5
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                      const std::function<double(double)>& sum_over_ranks) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> norms;
    for (const auto& p : params) {
        if (!p.grad().defined()) continue;
        // Gathered on the first one's device: block swap keeps some gradients on the host.
        const c10::Device where = norms.empty() ? p.device() : norms.front().device();
        norms.push_back(p.grad().norm(2).to(where, at::kFloat));
    }
    double total = norms.empty() ? 0.0 : at::stack(norms).norm(2).item<double>();
    if (sum_over_ranks) total = std::sqrt(sum_over_ranks(total * total));
    if (norms.empty()) return total;
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
        for (const auto& p : params) {
            if (p.grad().defined()) p.grad().mul_(coef);
        }
    }
    return total;
}

LossScaler::LossScaler(bool enabled, LossScalerOptions options)
    : enabled_(enabled), options_(options), scale_(options.init_scale) {}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const {
    return enabled_ ? loss * scale_ : loss;
}

bool LossScaler::unscale(const std::vector<at::Tensor>& params) const {
    at::NoGradGuard no_grad;
    // One flag per gradient, read back once: a read per parameter would wait for the device
    // hundreds of times a step.
    std::vector<at::Tensor> finite;
    for (const auto& p : params) {
        at::Tensor g = p.grad();
        if (!g.defined()) continue;
        if (enabled_) g.mul_(1.0 / scale_);
        const at::Tensor ok = at::isfinite(g).all();
        finite.push_back(finite.empty() ? ok : ok.to(finite.front().device()));
    }
    return finite.empty() || at::stack(finite).all().item<bool>();
}

void LossScaler::update(bool found_inf) {
    if (!enabled_) return;
    if (found_inf) {
        scale_ *= options_.backoff_factor;
        good_steps_ = 0;
        ++skipped_;
        return;
    }
    if (++good_steps_ >= options_.growth_interval) {
        scale_ *= options_.growth_factor;
        good_steps_ = 0;
    }
}

std::map<std::string, double> LossScaler::state() const {
    return {{"scale", scale_},
            {"good_steps", static_cast<double>(good_steps_)},
            {"skipped", static_cast<double>(skipped_)}};
}

void LossScaler::load_state(const std::map<std::string, double>& state) {
    auto get = [&](const char* key) {
        auto it = state.find(key);
        if (it == state.end())
            throw Error::InvalidArgument(fmt::format("loss scaler state: '{}' missing", key));
        return it->second;
    };
    scale_ = get("scale");
    good_steps_ = static_cast<int64_t>(get("good_steps"));
    skipped_ = static_cast<int64_t>(get("skipped"));
}

}  // namespace sf::train
