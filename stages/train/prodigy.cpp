#include "stages/train/prodigy.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sf::train {
namespace {

at::Tensor scalar(double v) { return at::scalar_tensor(v, at::kDouble); }

}  // namespace

Prodigy::Prodigy(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options)
    : Optimizer(std::move(params)),
      options_(options),
      state_(params_.size()),
      d_(options.prodigy.d0),
      d_max_(options.prodigy.d0) {
    const ProdigyOptions& p = options_.prodigy;
    if (!(options_.lr > 0))
        throw Error::InvalidArgument(fmt::format(
            "--learning_rate must be > 0 with --optimizer prodigy (about 1.0: it multiplies "
            "Prodigy's own step size), got {}",
            options_.lr));
    if (options_.beta1 < 0 || options_.beta1 >= 1 || options_.beta2 < 0 || options_.beta2 >= 1)
        throw Error::InvalidArgument("--adam_beta1 and --adam_beta2 must be in [0, 1)");
    if (!(options_.eps > 0)) throw Error::InvalidArgument("--adam_epsilon must be > 0");
    if (options_.weight_decay < 0) throw Error::InvalidArgument("--adam_weight_decay must be >= 0");
    if (!(p.beta3 >= 0 && p.beta3 < 1))
        throw Error::InvalidArgument(fmt::format(
            "--prodigy_beta3 must be in (0, 1) (or unset: sqrt(--adam_beta2)), got {}", p.beta3));
    if (!(p.d0 > 0) || !std::isfinite(p.d0))
        throw Error::InvalidArgument("prodigy's d0 must be > 0");
    if (!(p.d_coef > 0) || !std::isfinite(p.d_coef))
        throw Error::InvalidArgument("prodigy's d_coef must be > 0");
    if (p.growth_rate != 0 && !(p.growth_rate >= 1))
        throw Error::InvalidArgument("prodigy's growth_rate must be >= 1 (or 0: unbounded)");
    beta3_ = p.beta3 > 0 ? p.beta3 : std::sqrt(options_.beta2);
}

void Prodigy::set_owned(std::vector<bool> owned) {
    Optimizer::set_owned(std::move(owned));
    for (size_t i = 0; i < params_.size(); ++i) {
        if (!owns(i)) state_[i] = PerParam{};
    }
}

void Prodigy::step(double lr) {
    at::NoGradGuard no_grad;
    const ProdigyOptions& o = options_.prodigy;
    const double beta1 = options_.beta1, beta2 = options_.beta2, decay = options_.weight_decay;
    const double k = static_cast<double>(k_);
    const double bias_correction =
        o.use_bias_correction ? std::sqrt(1 - std::pow(beta2, k + 1)) / (1 - std::pow(beta1, k + 1))
                              : 1.0;
    const double dlr = d_ * lr * bias_correction;
    double d_numerator = d_numerator_ * beta3_;
    // The sums over parameters stay on the device until read once.
    at::Tensor numerator, denominator;
    auto add = [](at::Tensor& sum, const at::Tensor& term) {
        const at::Tensor t = term.to(at::kDouble);
        sum = sum.defined() ? sum + t.to(sum.device()) : t;
    };
    std::vector<size_t> stepped;
    for (size_t i = 0; i < params_.size(); ++i) {
        const at::Tensor& p = params_[i].second;
        if (!p.grad().defined() || !owns(i)) continue;
        at::Tensor grad = p.grad();
        if (decay != 0 && !o.decouple) grad.add_(p, decay);  // coupled weight decay
        PerParam& st = state_[i];
        if (!st.exp_avg.defined()) {
            st.s = at::zeros({p.numel()}, p.options());
            st.p0 = p.any().item<bool>() ? p.detach().flatten().clone()
                                         : at::zeros({}, p.options());  // all zeros: a scalar
            st.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
            st.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
        }
        if (lr <= 0) continue;
        const at::Tensor flat = grad.flatten();
        add(numerator,
            at::dot(flat, st.p0 - p.detach().flatten()).to(at::kDouble) * ((d_ / o.d0) * dlr));
        st.exp_avg.mul_(beta1).add_(grad, d_ * (1 - beta1));
        st.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, d_ * d_ * (1 - beta2));
        st.s.mul_(beta3_).add_(flat, (d_ / o.d0) * (o.safeguard_warmup ? d_ : dlr));
        add(denominator, st.s.abs().sum());
        stepped.push_back(i);
    }
    double d_denom = denominator.defined() ? denominator.item<double>() : 0.0;
    double terms = numerator.defined() ? numerator.item<double>() : 0.0;
    if (rank_sum_) {  // every rank's share of both sums (prodigyopt's fsdp_in_use all-reduce)
        d_denom = rank_sum_(d_denom);
        terms = rank_sum_(terms);
    }
    if (d_denom == 0) return;  // no progress to estimate from (as prodigyopt: nothing updated)
    d_numerator += terms;
    const double d_hat = o.d_coef * d_numerator / d_denom;
    double d = d_;
    if (d == o.d0) d = std::max(d, d_hat);
    d_max_ = std::max(d_max_, d_hat);
    const double growth =
        o.growth_rate > 0 ? o.growth_rate : std::numeric_limits<double>::infinity();
    d = std::min(d_max_, d * growth);
    d_numerator_ = d_numerator;
    d_ = d;
    for (const size_t i : stepped) {
        const at::Tensor& p = params_[i].second;
        PerParam& st = state_[i];
        ++st.step;
        const at::Tensor denom = st.exp_avg_sq.sqrt().add_(d_ * options_.eps);
        at::Tensor data = p.detach();
        if (decay != 0 && o.decouple) data.add_(data, -decay * dlr);
        data.addcdiv_(st.exp_avg, denom, -dlr);
    }
    ++k_;
}

std::map<std::string, at::Tensor> Prodigy::state() const {
    std::map<std::string, at::Tensor> out;
    for (size_t i = 0; i < params_.size(); ++i) {
        const PerParam& st = state_[i];
        if (!st.exp_avg.defined()) continue;  // never stepped
        const std::string& name = params_[i].first;
        out[name + ".exp_avg"] = st.exp_avg;
        out[name + ".exp_avg_sq"] = st.exp_avg_sq;
        out[name + ".s"] = st.s;
        out[name + ".p0"] = st.p0;
        out[name + ".step"] = at::scalar_tensor(st.step, at::kLong);
    }
    out["prodigy.d"] = scalar(d_);
    out["prodigy.d_max"] = scalar(d_max_);
    out["prodigy.d_numerator"] = scalar(d_numerator_);
    out["prodigy.k"] = at::scalar_tensor(k_, at::kLong);
    return out;
}

void Prodigy::load_state(const std::map<std::string, at::Tensor>& state) {
    at::NoGradGuard no_grad;
    auto get = [&](const std::string& key) -> const at::Tensor& {
        const auto it = state.find(key);
        if (it == state.end() || !it->second.defined())
            throw Error::InvalidArgument(fmt::format(
                "optimizer state: {} is missing (a checkpoint of another --optimizer resumes with "
                "that optimizer only)",
                key));
        return it->second;
    };
    std::vector<PerParam> loaded(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
        const auto& [name, p] = params_[i];
        // Never stepped, or another rank's (ZeRO-1).
        if (state.count(name + ".step") == 0 || !owns(i)) continue;
        PerParam& st = loaded[i];
        st.step = get(name + ".step").item<int64_t>();
        auto place = [&](const std::string& which, std::vector<int64_t> shape, bool scalar_ok) {
            const at::Tensor& t = get(name + which);
            const bool fits = t.sizes().vec() == shape || (scalar_ok && t.dim() == 0);
            if (!fits)
                throw Error::InvalidArgument(
                    fmt::format("optimizer state: {}{} has the wrong shape", name, which));
            return t.to(p.device(), p.scalar_type()).clone();
        };
        st.exp_avg = place(".exp_avg", p.sizes().vec(), false);
        st.exp_avg_sq = place(".exp_avg_sq", p.sizes().vec(), false);
        st.s = place(".s", {p.numel()}, false);
        st.p0 = place(".p0", {p.numel()}, true);
    }
    const double d = get("prodigy.d").item<double>(), d_max = get("prodigy.d_max").item<double>();
    const double numerator = get("prodigy.d_numerator").item<double>();
    if (!(d > 0) || !(d_max > 0) || !std::isfinite(d) || !std::isfinite(d_max) ||
        !std::isfinite(numerator))
        throw Error::InvalidArgument("optimizer state: Prodigy's estimate is not finite and > 0");
    state_ = std::move(loaded);
    d_ = d;
    d_max_ = d_max;
    d_numerator_ = numerator;
    k_ = get("prodigy.k").item<int64_t>();
}

}  // namespace sf::train
