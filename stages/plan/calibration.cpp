#include "stages/plan/calibration.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "stages/plan/start_plan.h"
#include "stages/plan/step_probe.h"
#include "storage/atomic_file.h"

namespace sf::plan {

std::string calibration_key(const PlanShape& like, const PlanRemedies& r) {
    const bool lora = like.lora_rank > 0;
    if (like.video) {
        const auto& v = *like.video;
        return fmt::format("video/{}/patch{}x{}x{}{}{}{}{}", r.key(lora), v.patch_size[0],
                           v.patch_size[1], v.patch_size[2], v.attention_bias ? "/qkv_bias" : "",
                           v.norm_elementwise_affine ? "/affine" : "",
                           v.guidance_embeds ? "/guidance" : "", v.qk_norm ? "" : "/no_qk_norm");
    }
    const auto& config = like.config;
    return fmt::format("{}/patch{}{}{}{}", r.key(lora), config.patch_size,
                       config.interpolation_scale ? "/pos" : "",
                       config.attention_bias ? "/qkv_bias" : "",
                       config.norm_elementwise_affine ? "/affine" : "");
}

std::vector<double> fit_relative_nonnegative(const std::vector<std::vector<double>>& a,
                                             const std::vector<double>& b) {
    const int64_t rows = static_cast<int64_t>(a.size());
    const int64_t cols = rows > 0 ? static_cast<int64_t>(a[0].size()) : 0;
    // Each row divided by its target (relative error), each column by its largest entry.
    at::Tensor m = torch::zeros({rows, cols}, torch::kFloat64);
    auto acc = m.accessor<double, 2>();
    for (int64_t i = 0; i < rows; ++i) {
        if (!(b[i] > 0)) throw Error::InvalidArgument("fit: every target must be positive");
        for (int64_t j = 0; j < cols; ++j) acc[i][j] = a[i][j] / b[i];
    }
    at::Tensor scale = std::get<0>(m.abs().max(0)).clamp_min(1e-300);
    m = m / scale;
    const at::Tensor ones = torch::ones({rows, 1}, torch::kFloat64);

    std::vector<bool> passive(cols, false);
    at::Tensor x = torch::zeros({cols, 1}, torch::kFloat64);
    auto solve_passive = [&]() {
        std::vector<int64_t> idx;
        for (int64_t j = 0; j < cols; ++j)
            if (passive[j]) idx.push_back(j);
        at::Tensor s = torch::zeros({cols, 1}, torch::kFloat64);
        if (idx.empty()) return s;
        const at::Tensor cols_p = torch::tensor(idx, torch::kLong);
        const at::Tensor sol = std::get<0>(
            at::linalg_lstsq(m.index_select(1, cols_p), ones, c10::nullopt, std::string("gelsd")));
        s.index_copy_(0, cols_p, sol);
        return s;
    };
    constexpr double kTol = 1e-12;
    for (int64_t outer = 0; outer < 3 * cols; ++outer) {
        const at::Tensor w = m.t().matmul(ones - m.matmul(x));
        int64_t best = -1;
        double best_w = kTol;
        for (int64_t j = 0; j < cols; ++j) {
            const double wj = w[j][0].item<double>();
            if (!passive[j] && wj > best_w) best = j, best_w = wj;
        }
        if (best < 0) break;
        passive[best] = true;
        at::Tensor s = solve_passive();
        for (int64_t inner = 0; inner < 3 * cols; ++inner) {
            double alpha = 1;
            bool any = false;
            for (int64_t j = 0; j < cols; ++j) {
                const double sj = s[j][0].item<double>(), xj = x[j][0].item<double>();
                if (passive[j] && sj <= kTol) {
                    alpha = std::min(alpha, xj / std::max(xj - sj, 1e-300));
                    any = true;
                }
            }
            if (!any) break;
            x = x + alpha * (s - x);
            for (int64_t j = 0; j < cols; ++j) {
                if (passive[j] && x[j][0].item<double>() <= kTol) passive[j] = false;
            }
            s = solve_passive();
        }
        x = s;
    }
    x = (x.squeeze(1) / scale).contiguous();
    return std::vector<double>(x.data_ptr<double>(), x.data_ptr<double>() + cols);
}

PhaseModel fit_phase(const std::vector<std::vector<double>>& a, const std::vector<double>& b) {
    const size_t min_points = 8;
    auto error_of = [&](const PhaseModel& m) {
        double e = 0;
        for (size_t i = 0; i < a.size(); ++i) e += std::pow((m.eval(a[i]) - b[i]) / b[i], 2);
        return e;
    };
    const PhaseModel one{{fit_relative_nonnegative(a, b)}};
    PhaseModel best = one;
    double best_error = error_of(one);
    if (a.empty()) return best;
    // Starting splits, one per term: the points where the term makes more of the target than it
    // does at the median point against the others (the term that the moment of the peak
    // depends on, such as the gradients' share at the end of the backward pass, separates them).
    std::vector<std::vector<int>> starts;
    for (size_t j = 0; j < a.front().size(); ++j) {
        std::vector<double> share(a.size());
        for (size_t i = 0; i < a.size(); ++i) share[i] = a[i][j] / b[i];
        std::vector<double> sorted = share;
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        const double median = sorted[sorted.size() / 2];
        std::vector<int> side(a.size());
        for (size_t i = 0; i < a.size(); ++i) side[i] = share[i] > median ? 1 : 0;
        starts.push_back(std::move(side));
    }
    for (std::vector<int> side : starts) {
        for (int round = 0; round < 20; ++round) {
            std::vector<std::vector<double>> sa[2];
            std::vector<double> sb[2];
            for (size_t i = 0; i < a.size(); ++i) {
                sa[side[i]].push_back(a[i]);
                sb[side[i]].push_back(b[i]);
            }
            if (sa[0].size() < min_points || sa[1].size() < min_points) break;
            const PhaseModel two{
                {fit_relative_nonnegative(sa[0], sb[0]), fit_relative_nonnegative(sa[1], sb[1])}};
            const double e = error_of(two);
            if (e < best_error) best = two, best_error = e;
            bool moved = false;
            for (size_t i = 0; i < a.size(); ++i) {
                double y[2] = {0, 0};
                for (int k = 0; k < 2; ++k)
                    for (size_t j = 0; j < a[i].size(); ++j) y[k] += two.planes[k][j] * a[i][j];
                const int s = y[1] > y[0] ? 1 : 0;
                moved = moved || s != side[i];
                side[i] = s;
            }
            if (!moved) break;
        }
    }
    return best;
}

namespace {

struct Point {
    PlanShape shape;
    PlanRemedies remedies;
};

// The largest latent a point draws, in patches per side, and the largest batch (3 samples per
// micro-batch, accumulation 2).
constexpr int64_t kMostPatches = 24, kMostBatch = 3 * 2;

// Tiny configurations like `base` whose sizes vary independently (seeded: the same points on
// every run).
std::vector<Point> points_like(const PlanShape& like, const PlanRemedies& r, int64_t count) {
    const bool lora = like.lora_rank > 0;
    std::mt19937_64 rng(20261202);
    // Apart, so that the other draws are every key's.
    std::mt19937_64 swap_rng(20261203), frames_rng(20261204);
    auto pick = [&rng](std::initializer_list<int64_t> v) {
        return *(v.begin() + static_cast<int64_t>(rng() % v.size()));
    };
    auto between = [&rng](int64_t lo, int64_t hi) {
        return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    };
    std::vector<Point> out;
    for (int64_t i = 0; i < count; ++i) {
        Point p;
        p.shape = like;
        // The structure's sizes, the same draws for either transformer.
        auto draw = [&](auto& c, int64_t patch) {
            c.num_layers = pick({1, 2, 3});
            c.num_attention_heads = pick({1, 2, 4, 8});
            c.attention_head_dim = pick({8, 16});
            c.num_cross_attention_heads = pick({1, 2, 4, 8});
            c.cross_attention_head_dim = pick({8, 16});
            c.cross_attention_dim = c.inner_dim();
            c.caption_channels = pick({8, 16, 32, 64});
            c.in_channels = c.out_channels = pick({4, 8, 16});
            c.sample_size = 8;
            p.shape.latent_height = between(4, kMostPatches) * patch;
            p.shape.latent_width = between(4, kMostPatches) * patch;
        };
        if (p.shape.video) {
            auto& v = *p.shape.video;
            draw(v, v.patch_size[1]);
            // Windows of 1 to 6 latent frames (the height and width are drawn above).
            p.shape.latent_frames = (1 + static_cast<int64_t>(frames_rng() % 6)) * v.patch_size[0];
        } else {
            draw(p.shape.config, p.shape.config.patch_size);
        }
        p.shape.caption_tokens = between(4, 96);
        p.remedies = r;
        p.remedies.accumulation = pick({1, 2});
        p.shape.batch = pick({1, 2, 3}) * p.remedies.accumulation;
        if (p.shape.video) {
            // No more tokens in the batch than the largest image point's (the most patches and
            // batch): the longest windows of the widest frames have fewer frames. Such a point took
            // 40 s in bf16 on a CPU without native bf16 products, as much as all the others
            // together.
            const Structure frame = structure_of(p.shape);
            const int64_t most =
                std::max<int64_t>(1, kMostPatches * kMostPatches * kMostBatch /
                                         (frame.rows * frame.row_tokens * p.shape.batch));
            if (frame.frames > most) p.shape.latent_frames = most * p.shape.video->patch_size[0];
        }
        const Structure st = structure_of(p.shape);
        // Every value is drawn whatever the remedies, so that the points of every key have the
        // same shapes (their step times compare: the search's cost).
        const int64_t rank = pick({2, 4, 8}), chunk_draw = between(0, 1 << 20),
                      rows_draw = between(0, 1 << 20);
        p.shape.lora_rank = lora ? rank : 0;
        const int64_t tokens = st.tokens();
        // Chunks of rows (image) or frames (video).
        const int64_t ff_units = st.video ? st.frames : st.rows;
        // Up to half again the tokens and one row more than there are: a third of the points run
        // the self-attention and a few the feed-forward whole, as a chunk that holds them all does.
        if (r.chunked_attention())
            p.remedies.attention_chunk = 2 + chunk_draw % (tokens + tokens / 2);
        if (r.ff_chunk_size > 0) p.remedies.ff_chunk_size = 1 + rows_draw % ff_units;
        if (r.blocks_to_swap > 0)
            p.remedies.blocks_to_swap = 1 + static_cast<int64_t>(swap_rng() % st.layers);
        out.push_back(p);
    }
    return out;
}

}  // namespace

void calibrate(Calibration& into, const PlanShape& like, const PlanRemedies& r, c10::Device device,
               int64_t points) {
    const std::string key = calibration_key(like, r);
    into.seconds[key].clear();
    std::map<std::string, std::vector<std::vector<double>>> features;
    std::map<std::string, std::vector<double>> targets;
    struct Measured {
        std::vector<double> x;
        double fixed = 0, peak = 0;
    };
    std::vector<Measured> measured;
    int64_t done = 0;
    for (const Point& p : points_like(like, r, points)) {
        const ParameterCensus census = count_parameters(p.shape);
        const Structure st = structure_of(p.shape);
        torch::manual_seed(done);
        const std::shared_ptr<model::DiffusionTransformer> m = build_transformer(p.shape);
        m->module().to(device);
        ProbeInput in;
        in.latents = torch::randn(latent_sizes(p.shape));
        in.caption_tokens = p.shape.caption_tokens;
        in.caption_channels = st.caption_channels;
        in.steps = 1;
        in.adamw.eight_bit = r.optimizer == "adamw8bit";
        in.adamw.prodigy.enabled = r.optimizer == "prodigy";
        const ProbeResult result = probe_step(m, in, step_options_of(p.remedies), device);
        const int64_t layers = st.layers;
        const std::vector<double> x =
            step_features(p.shape, p.remedies, device_share(census, p.remedies, layers));
        const Footprint static_part = static_footprint(census, p.remedies, layers);
        const int64_t fixed = static_part.weights + static_part.optimizer_state;
        for (const auto& [phase, peak] : result.phases) {
            features[phase].push_back(x);
            targets[phase].push_back(
                static_cast<double>(std::max<int64_t>(1, peak.tensor_bytes - fixed)));
        }
        measured.push_back(
            {x, static_cast<double>(fixed), static_cast<double>(result.peak_tensor_bytes)});
        into.seconds[key].push_back(result.step_seconds);
        ++done;
    }
    PhaseModels& phases = into.keys[key];
    phases.clear();
    for (const auto& [phase, a] : features) phases[phase] = fit_phase(a, targets[phase]);
    // How well the fit explains its own points: the predicted peak (the highest phase) against
    // the measured one.
    double worst = 0;
    for (const Measured& m : measured) {
        double highest = 0;
        for (const auto& [phase, model] : phases) highest = std::max(highest, model.eval(m.x));
        worst = std::max(worst, std::abs(m.fixed + highest - m.peak) / m.peak);
    }
    into.fit_error[key] = worst;
    into.device = device.str();
    into.points = points;
    log_info("plan: calibrated {} on {} from {} steps (worst fit error {:.1f}%)", key, device.str(),
             done, 100 * worst);
}

double Calibration::relative_time(const std::string& key, const std::string& base) const {
    const auto k = seconds.find(key), b = seconds.find(base);
    if (k == seconds.end() || b == seconds.end() || k->second.size() != b->second.size() ||
        k->second.empty())
        return 1.0;
    std::vector<double> ratios;
    for (size_t i = 0; i < k->second.size(); ++i)
        ratios.push_back(k->second[i] / std::max(b->second[i], 1e-9));
    std::sort(ratios.begin(), ratios.end());
    return ratios[ratios.size() / 2];
}

std::string Calibration::to_json() const {
    nlohmann::json j;
    j["device"] = device;
    j["points"] = points;
    j["features"] = kFeatureNames;
    for (const auto& [key, phases] : keys) {
        for (const auto& [phase, model] : phases) j["keys"][key][phase] = model.planes;
        if (auto it = fit_error.find(key); it != fit_error.end()) j["fit_error"][key] = it->second;
        if (auto it = seconds.find(key); it != seconds.end()) j["seconds"][key] = it->second;
    }
    return j.dump(1);
}

Calibration Calibration::from_json(const std::string& text, const std::string& where) {
    Calibration c;
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        c.device = j.at("device").get<std::string>();
        c.points = j.at("points").get<int64_t>();
        if (j.at("features").get<std::vector<std::string>>() != kFeatureNames) {
            throw Error::Corruption(
                fmt::format("{}: made with other structural terms (another version of sanaflow): "
                            "calibrate again (--calibrate)",
                            where));
        }
        if (j.contains("keys")) {
            for (const auto& [key, phases] : j.at("keys").items()) {
                for (const auto& [phase, planes] : phases.items()) {
                    PhaseModel& m = c.keys[key][phase];
                    m.planes = planes.get<std::vector<Coefficients>>();
                    for (const Coefficients& coef : m.planes) {
                        if (coef.size() != kFeatureNames.size()) {
                            throw Error::Corruption(
                                fmt::format("{}: keys.{}.{} has {} coefficients, not {}", where,
                                            key, phase, coef.size(), kFeatureNames.size()));
                        }
                    }
                }
            }
        }
        if (j.contains("seconds")) {
            for (const auto& [key, t] : j.at("seconds").items())
                c.seconds[key] = t.get<std::vector<double>>();
        }
        if (j.contains("fit_error")) {
            for (const auto& [key, e] : j.at("fit_error").items())
                c.fit_error[key] = e.get<double>();
        }
    } catch (const nlohmann::json::exception& e) {
        throw Error::Corruption(fmt::format("{}: not a sanaflow plan calibration: {}", where,
                                            std::string(e.what()).substr(0, 200)));
    }
    return c;
}

}  // namespace sf::plan

namespace sf::plan {

std::string default_calibration_file(c10::Device device) {
    std::filesystem::path dir;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
        dir = xdg;
    } else if (const char* home = std::getenv("HOME"); home && *home) {
        dir = std::filesystem::path(home) / ".cache";
    } else {
        return "";
    }
    std::string name = device.str();
    std::replace(name.begin(), name.end(), ':', '-');
    return (dir / "sanaflow" / fmt::format("plan-calibration-{}.json", name)).string();
}

CalibrationStore::CalibrationStore(c10::Device device, std::string file, bool recalibrate,
                                   int64_t points)
    : device_(device), file_(std::move(file)), recalibrate_(recalibrate), points_(points) {
    if (file_.empty() || !std::filesystem::exists(file_)) return;
    Calibration c;
    try {
        c = Calibration::from_json(storage::read_file(file_), file_);
    } catch (const Error& e) {
        log_warn("plan: {}: calibrating again (the file will be replaced)", e.what());
        return;
    }
    if (c.device != device.str() || c.points != points_) {
        log_info(
            "plan: {} was measured on {} from {} steps per key, not on {} from {}: "
            "calibrating again",
            file_, c.device, c.points, device.str(), points_);
        return;
    }
    cal_ = std::move(c);
}

PhaseModels CalibrationStore::phases(const PlanShape& like, const PlanRemedies& r) {
    return measured(like, r);
}

const PhaseModels& CalibrationStore::measured(const PlanShape& like, const PlanRemedies& given) {
    const PlanRemedies r = given.calibrated();
    const std::string key = calibration_key(like, r);
    if (!cal_.keys.count(key) || (recalibrate_ && !fresh_.count(key))) {
        calibrate(cal_, like, r, device_, points_);
        fresh_.insert(key);
    }
    return cal_.keys.at(key);
}

double CalibrationStore::relative_time(const PlanShape& like, const PlanRemedies& r) {
    PlanRemedies none;
    none.optimizer = r.optimizer;
    measured(like, none);
    measured(like, r);
    return cal_.relative_time(calibration_key(like, r.calibrated()), calibration_key(like, none));
}

void CalibrationStore::save() const {
    if (file_.empty() || fresh_.empty()) return;
    const std::filesystem::path parent = std::filesystem::path(file_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    storage::write_file_atomic(file_, cal_.to_json());
    log_info("plan: calibration written to {}", file_);
}

}  // namespace sf::plan
