#include "tools/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <vector>

#include "core/error.h"
#include "core/timeline.h"
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
// `x_label` names the horizontal axis' unit ("step {:.0f}", "{:.1f} s").
void draw_panel(cv::Mat& image, int y0, const std::string& title, const std::vector<Series>& series,
                double first_step, double last_step, const char* x_label = "step {:.0f}") {
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
    cv::putText(image, fmt::format(fmt::runtime(x_label), first_step), {x_left, y_bottom + 18},
                cv::FONT_HERSHEY_SIMPLEX, 0.4, kText, 1, cv::LINE_AA);
    cv::putText(image, fmt::format(fmt::runtime(x_label), last_step), {x_right - 80, y_bottom + 18},
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

struct Bar {
    double begin, end;
    std::string name;
};

constexpr int kLaneRow = 22;

// Sorts a lane's bars by start and gives each its depth: the number of bars it lies inside (a
// step holds its phases), so nested spans go on rows of their own. Returns the rows needed.
int nest(std::vector<Bar>& bars, std::vector<int>& depth) {
    std::sort(bars.begin(), bars.end(), [](const Bar& a, const Bar& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<double> open;  // ends of the bars the current one may lie inside
    int rows = 1;
    depth.clear();
    for (const Bar& b : bars) {
        while (!open.empty() && open.back() <= b.begin) open.pop_back();
        depth.push_back(static_cast<int>(open.size()));
        rows = std::max(rows, depth.back() + 1);
        open.push_back(b.end);
    }
    return rows;
}

// The spans of each lane as rows of bars under the counters, on the same time axis, nested spans
// a row lower; a bar wide enough for its name is labelled. Returns the height drawn (with a null
// image, only that).
int draw_lanes(cv::Mat* image, int y0, std::map<std::string, std::vector<Bar>>& lanes, double first,
               double last) {
    const int x_left = kLeft, x_right = kWidth - kRight;
    auto px = [&](double t) {
        return x_left +
               static_cast<int>((t - first) / std::max(1e-9, last - first) * (x_right - x_left));
    };
    int y = y0;
    for (auto& [lane, bars] : lanes) {
        std::vector<int> depth;
        const int rows = nest(bars, depth);
        if (image != nullptr) {
            cv::putText(*image, lane, {6, y + 16}, cv::FONT_HERSHEY_SIMPLEX, 0.45, kText, 1,
                        cv::LINE_AA);
            for (size_t i = 0; i < bars.size(); ++i) {
                const Bar& b = bars[i];
                const int top = y + depth[i] * kLaneRow;
                const int x0 = px(b.begin), x1 = std::max(px(b.end), x0 + 1);
                cv::rectangle(*image, {x0, top + 2}, {x1, top + kLaneRow - 2},
                              kColours[i % std::size(kColours)], -1);
                int baseline = 0;
                const int text =
                    cv::getTextSize(b.name, cv::FONT_HERSHEY_SIMPLEX, 0.35, 1, &baseline).width;
                if (x1 - x0 > text + 4) {
                    cv::putText(*image, b.name, {x0 + 2, top + 15}, cv::FONT_HERSHEY_SIMPLEX, 0.35,
                                kWhite, 1, cv::LINE_AA);
                }
            }
        }
        y += rows * kLaneRow + 4;
    }
    return y - y0;
}

}  // namespace

std::string plot_memory_timeline(const std::string& dir) {
    const fs::path path = fs::path(dir) / mem::kTimelineFileName;
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw Error::NotFound(fmt::format("plot: no {} (prep and train write it)", path.string()));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json trace = storage::parse_json(text, path.string());
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
        throw Error::InvalidArgument(
            fmt::format("plot: {} is not a Chrome trace (no traceEvents array)", path.string()));
    }
    std::map<std::string, Series> counters;
    std::map<int64_t, std::string> lane_names;
    std::map<int64_t, std::vector<Bar>> bars;
    double first = INFINITY, last = -INFINITY;
    for (const auto& e : trace["traceEvents"]) {
        if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string()) continue;
        const std::string ph = e["ph"].get<std::string>();
        const std::string name = e.value("name", std::string());
        const int64_t tid = e.contains("tid") && e["tid"].is_number() ? e["tid"].get<int64_t>() : 0;
        if (ph == "M" && name == "thread_name" && e.contains("args")) {
            lane_names[tid] = e["args"].value("name", std::string());
        }
        if (!e.contains("ts") || !e["ts"].is_number()) continue;
        const double t = e["ts"].get<double>() / 1e6;
        if (ph == "C" && e.contains("args") && e["args"].contains("bytes")) {
            Series& s = counters[name];
            s.name = name.substr(0, name.rfind(" bytes"));
            s.points.emplace_back(t, e["args"]["bytes"].get<double>() / (1 << 20));
        } else if (ph == "X" && e.contains("dur") && e["dur"].is_number()) {
            bars[tid].push_back({t, t + e["dur"].get<double>() / 1e6, name});
        } else {
            continue;
        }
        first = std::min(first, t);
        last = std::max(last, t);
    }
    if (counters.empty()) {
        throw Error::InvalidArgument(fmt::format("plot: {} holds no memory sample", path.string()));
    }
    std::map<std::string, std::vector<Bar>> lanes;
    for (auto& [tid, lane] : bars) {
        const auto name = lane_names.find(tid);
        lanes[name == lane_names.end() ? fmt::format("lane {}", tid) : name->second] =
            std::move(lane);
    }
    std::vector<Series> memory;
    for (auto& [name, s] : counters) memory.push_back(std::move(s));
    const int lanes_height = draw_lanes(nullptr, 0, lanes, first, last);
    cv::Mat image(kPanelHeight + lanes_height + 10, kWidth, CV_8UC3, kWhite);
    draw_panel(image, 0, "memory (MiB)", memory, first, last, "{:.1f} s");
    draw_lanes(&image, kPanelHeight, lanes, first, last);
    const std::string out = (fs::path(dir) / "memory_timeline.png").string();
    if (!cv::imwrite(out, image)) throw Error::IOError(fmt::format("plot: cannot write {}", out));
    return out;
}

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
