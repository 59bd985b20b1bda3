#include "tools/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "core/error.h"
#include "storage/json_text.h"

namespace sf::tools {
namespace {

namespace fs = std::filesystem;

constexpr int kWidth = 960, kPanelHeight = 260, kLeft = 90, kRight = 20, kTop = 30, kBottom = 30;
const cv::Scalar kWhite(255, 255, 255), kGrid(225, 225, 225), kText(40, 40, 40);
// One colour per curve (BGR).
const cv::Scalar kColours[] = {{180, 119, 31}, {14, 127, 255},  {44, 160, 44},
                               {40, 39, 214},  {189, 103, 148}, {75, 86, 140}};

struct Series {
    std::string name;
    std::vector<std::pair<double, double>> points;  // (step, value), finite values only
};

// Draws `series` into the panel whose top is `y0`: axes with the value range, a grid, a legend.
void draw_panel(cv::Mat& image, int y0, const std::string& title, const std::vector<Series>& series,
                double first_step, double last_step) {
    double lo = INFINITY, hi = -INFINITY;
    for (const Series& s : series) {
        for (const auto& [x, y] : s.points) {
            lo = std::min(lo, y);
            hi = std::max(hi, y);
        }
    }
    if (!std::isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) lo -= 0.5, hi += 0.5;
    const int x_left = kLeft, x_right = kWidth - kRight;
    const int y_top = y0 + kTop, y_bottom = y0 + kPanelHeight - kBottom;
    auto px = [&](double step) {
        const double span = std::max(1.0, last_step - first_step);
        return x_left + static_cast<int>((step - first_step) / span * (x_right - x_left));
    };
    auto py = [&](double v) {
        return y_bottom - static_cast<int>((v - lo) / (hi - lo) * (y_bottom - y_top));
    };
    for (int k = 0; k <= 4; ++k) {
        const double v = lo + (hi - lo) * k / 4;
        cv::line(image, {x_left, py(v)}, {x_right, py(v)}, kGrid, 1);
        cv::putText(image, fmt::format("{:.4g}", v), {6, py(v) + 4}, cv::FONT_HERSHEY_SIMPLEX, 0.4,
                    kText, 1, cv::LINE_AA);
    }
    cv::rectangle(image, {x_left, y_top}, {x_right, y_bottom}, kText, 1);
    cv::putText(image, title, {x_left, y0 + 20}, cv::FONT_HERSHEY_SIMPLEX, 0.55, kText, 1,
                cv::LINE_AA);
    cv::putText(image, fmt::format("step {:.0f}", first_step), {x_left, y_bottom + 18},
                cv::FONT_HERSHEY_SIMPLEX, 0.4, kText, 1, cv::LINE_AA);
    cv::putText(image, fmt::format("step {:.0f}", last_step), {x_right - 80, y_bottom + 18},
                cv::FONT_HERSHEY_SIMPLEX, 0.4, kText, 1, cv::LINE_AA);
    int baseline = 0;
    int legend_x =
        x_left + 30 + cv::getTextSize(title, cv::FONT_HERSHEY_SIMPLEX, 0.55, 1, &baseline).width;
    for (size_t i = 0; i < series.size(); ++i) {
        const cv::Scalar colour = kColours[i % std::size(kColours)];
        const auto& pts = series[i].points;
        for (size_t k = 1; k < pts.size(); ++k) {
            cv::line(image, {px(pts[k - 1].first), py(pts[k - 1].second)},
                     {px(pts[k].first), py(pts[k].second)}, colour, 2, cv::LINE_AA);
        }
        if (pts.size() == 1)
            cv::circle(image, {px(pts[0].first), py(pts[0].second)}, 3, colour, -1);
        cv::line(image, {legend_x, y0 + 15}, {legend_x + 20, y0 + 15}, colour, 2);
        cv::putText(image, series[i].name, {legend_x + 24, y0 + 19}, cv::FONT_HERSHEY_SIMPLEX, 0.4,
                    kText, 1, cv::LINE_AA);
        legend_x += 30 + 8 * static_cast<int>(series[i].name.size());
    }
}

}  // namespace

std::string plot_metrics(const std::string& output_dir) {
    const fs::path metrics = fs::path(output_dir) / "metrics.jsonl";
    std::ifstream in(metrics);
    if (!in) throw Error::NotFound(fmt::format("plot: no {} (train writes it)", metrics.string()));
    Series loss{"loss", {}}, mean{"running mean (20 steps)", {}}, lr{"learning rate", {}};
    std::map<std::string, Series> peaks;
    std::vector<double> window;
    int line_number = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_number;
        nlohmann::json j;
        try {
            j = storage::parse_json(line, fmt::format("{} line {}", metrics.string(), line_number));
        } catch (const Error&) {
            continue;  // a line cut short by a kill
        }
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
        const double step = j["step"].get<double>();
        if (j.contains("loss") && j["loss"].is_number()) {
            const double v = j["loss"].get<double>();
            loss.points.emplace_back(step, v);
            window.push_back(v);
            if (window.size() > 20) window.erase(window.begin());
            double sum = 0;
            for (double w : window) sum += w;
            mean.points.emplace_back(step, sum / static_cast<double>(window.size()));
        }
        if (j.contains("lr") && j["lr"].is_number())
            lr.points.emplace_back(step, j["lr"].get<double>());
        if (j.contains("peak_bytes") && j["peak_bytes"].is_object()) {
            for (const auto& [phase, bytes] : j["peak_bytes"].items()) {
                if (!bytes.is_number()) continue;
                Series& s = peaks[phase];
                s.name = phase;
                s.points.emplace_back(step, bytes.get<double>() / (1 << 20));
            }
        }
    }
    if (loss.points.empty()) {
        throw Error::InvalidArgument(fmt::format("plot: {} holds no step", metrics.string()));
    }
    const double first = loss.points.front().first, last = loss.points.back().first;
    cv::Mat image(3 * kPanelHeight, kWidth, CV_8UC3, kWhite);
    draw_panel(image, 0, "loss", {loss, mean}, first, last);
    draw_panel(image, kPanelHeight, "learning rate", {lr}, first, last);
    std::vector<Series> memory;
    for (auto& [phase, s] : peaks) memory.push_back(std::move(s));
    draw_panel(image, 2 * kPanelHeight, "peak memory per phase (MiB)", memory, first, last);
    const std::string out = (fs::path(output_dir) / "metrics.png").string();
    if (!cv::imwrite(out, image)) throw Error::IOError(fmt::format("plot: cannot write {}", out));
    return out;
}

}  // namespace sf::tools
