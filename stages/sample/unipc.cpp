#include "stages/sample/unipc.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "core/check.h"

namespace sf::sample {
namespace {

// Solves a x = b for n <= 3 unknowns by Gaussian elimination with partial pivoting.
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
    const size_t n = b.size();
    for (size_t c = 0; c < n; ++c) {
        size_t pivot = c;
        for (size_t r = c + 1; r < n; ++r)
            if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
        std::swap(a[c], a[pivot]);
        std::swap(b[c], b[pivot]);
        SF_CHECK(a[c][c] != 0, "UniPC: a singular system (two steps at one sigma)");
        for (size_t r = c + 1; r < n; ++r) {
            const double f = a[r][c] / a[c][c];
            for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
            b[r] -= f * b[c];
        }
    }
    std::vector<double> x(n);
    for (size_t c = n; c-- > 0;) {
        double sum = b[c];
        for (size_t k = c + 1; k < n; ++k) sum -= a[c][k] * x[k];
        x[c] = sum / a[c][c];
    }
    return x;
}

// One UniPC update from sigma `s0` to sigma `t` of order `order`, its earlier points at sigmas
// `earlier` (nearest first): the coefficients of upstream's multistep_uni_p/c_bh_update.
struct Update {
    double ratio = 0, alpha_t = 0, h_phi_1 = 0, b_h = 0;
    std::vector<double> rks;  // one per earlier point
    std::vector<double> b;    // `order` entries
};

Update update_of(double s0, double t, const std::vector<double>& earlier, int order) {
    const double h = flow_lambda(t) - flow_lambda(s0);
    const double hh = -h;
    Update u;
    u.ratio = t / s0;
    u.alpha_t = 1 - t;
    u.h_phi_1 = std::expm1(hh);
    u.b_h = std::expm1(hh);  // bh2
    for (const double s : earlier) u.rks.push_back((flow_lambda(s) - flow_lambda(s0)) / h);
    double phi = u.h_phi_1 / hh - 1, factorial = 1;
    for (int i = 1; i <= order; ++i) {
        u.b.push_back(phi * factorial / u.b_h);
        factorial *= i + 1;
        phi = phi / hh - 1 / factorial;
    }
    return u;
}

// R's rows p = 0 .. n-1 of rks[j]^p, j over the first n of `rks`.
std::vector<std::vector<double>> powers(const std::vector<double>& rks, size_t n) {
    std::vector<std::vector<double>> r(n, std::vector<double>(n));
    for (size_t p = 0; p < n; ++p)
        for (size_t j = 0; j < n; ++j) r[p][j] = std::pow(rks[j], static_cast<double>(p));
    return r;
}

// sum_k rho_k (x0_k - x0) / r_k over the earlier points: `history` holds the data predictions,
// newest (x0) last, x0_k the k-th before it.
at::Tensor weighted_differences(const std::deque<at::Tensor>& history, const Update& u,
                                const std::vector<double>& rho) {
    const at::Tensor& m0 = history.back();
    at::Tensor sum;
    for (size_t k = 0; k < u.rks.size(); ++k) {
        const at::Tensor d = (history[history.size() - 2 - k] - m0) * (rho[k] / u.rks[k]);
        sum = sum.defined() ? sum + d : d;
    }
    return sum;
}

}  // namespace

at::Tensor unipc_sample(const Velocity& velocity, const at::Tensor& noise,
                        const FlowSchedule& schedule, const UniPcOptions& options) {
    SF_CHECK(options.order >= 1 && options.order <= 3, "UniPC order must be 1, 2 or 3");
    const auto& sigmas = schedule.sigmas;
    const size_t steps = schedule.timesteps.size();
    SF_CHECK(steps > 0 && sigmas.size() == steps + 1, "the UniPC schedule needs steps + 1 sigmas");
    const auto corrects_after = [&](size_t step) {
        return std::find(options.disable_corrector.begin(), options.disable_corrector.end(),
                         static_cast<int64_t>(step)) == options.disable_corrector.end();
    };
    const auto earlier_sigmas = [&](size_t first, int count) {
        std::vector<double> out;
        for (int k = 0; k < count; ++k) out.push_back(sigmas[first - static_cast<size_t>(k)]);
        return out;
    };
    torch::NoGradGuard no_grad;
    at::Tensor x = noise.to(at::kFloat);
    at::Tensor last_sample;          // the last predictor's starting point
    std::deque<at::Tensor> history;  // data predictions, newest last, at most `order`
    int last_order = 0, warm = 0;
    for (size_t i = 0; i < steps; ++i) {
        const at::Tensor x0 = data_prediction(velocity, x, schedule, i);
        if (i > 0 && corrects_after(i - 1)) {
            // The last step again from last_sample, x0 joining its points.
            const Update u = update_of(sigmas[i - 1], sigmas[i],
                                       earlier_sigmas(i - 2, last_order - 1), last_order);
            std::vector<double> rho;
            if (last_order == 1) {
                rho = {0.5};
            } else {
                std::vector<double> rks = u.rks;
                rks.push_back(1.0);
                rho = solve(powers(rks, rks.size()), u.b);
            }
            const at::Tensor& m0 = history.back();
            at::Tensor correction = rho.back() * (x0 - m0);
            if (!u.rks.empty()) correction = correction + weighted_differences(history, u, rho);
            x = u.ratio * last_sample - u.alpha_t * u.h_phi_1 * m0 - u.alpha_t * u.b_h * correction;
        }
        history.push_back(x0);
        if (history.size() > static_cast<size_t>(options.order)) history.pop_front();
        // lower_order_final: no higher than the steps left; warm-up: no higher than the points.
        const int order = std::min({options.order, static_cast<int>(steps - i), warm + 1});
        last_sample = x;
        const Update u =
            update_of(sigmas[i], sigmas[i + 1], earlier_sigmas(i - 1, order - 1), order);
        at::Tensor next = u.ratio * x - u.alpha_t * u.h_phi_1 * x0;
        if (order >= 2) {
            const std::vector<double> rho =
                order == 2 ? std::vector<double>{0.5}
                           : solve(powers(u.rks, u.rks.size()),
                                   std::vector<double>(u.b.begin(), u.b.end() - 1));
            next = next - u.alpha_t * u.b_h * weighted_differences(history, u, rho);
        }
        x = next;
        last_order = order;
        warm = std::min(warm + 1, options.order);
    }
    return x;
}

}  // namespace sf::sample
