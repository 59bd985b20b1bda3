#include "pipelines/train/report/metrics_log.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "storage/atomic_file.h"
#include "storage/json_text.h"

namespace sf::pipelines {
namespace fs = std::filesystem;

namespace {

// The lines of an earlier run's file for steps 1..first_step, in order; anything else (a later
// step, a line cut short by a kill, a foreign line) is dropped.
std::string kept_lines(const std::string& path, int64_t first_step) {
    std::error_code ec;
    if (first_step == 0 || !fs::exists(path, ec)) return "";
    std::istringstream in(storage::read_file(path));
    std::string line, kept;
    int64_t last = 0;
    while (std::getline(in, line)) {
        try {
            const nlohmann::json j = storage::parse_json(line, path);
            const int64_t step = j.at("step").get<int64_t>();
            if (step > last && step <= first_step) {
                kept += line + "\n";
                last = step;
            }
        } catch (const std::exception&) {
            // a torn or foreign line: not kept
        }
    }
    return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir, int64_t first_step)
    : path_((fs::path(output_dir) / kMetricsFile).string()) {
    fs::create_directories(output_dir);
    storage::write_file_atomic(path_, kept_lines(path_, first_step));
    file_ = std::fopen(path_.c_str(), "a");
    if (file_ == nullptr) {
        throw Error::IOError(fmt::format("cannot open {}: {}", path_, std::strerror(errno)));
    }
}

MetricsLog::~MetricsLog() {
    if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::append(const StepMetrics& m) {
    auto finite_or_null = [](double v) {
        return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
    };
    nlohmann::json j;
    j["step"] = m.step;
    j["loss"] = finite_or_null(m.loss);
    j["lr"] = m.lr;
    j["grad_norm"] = finite_or_null(m.grad_norm);
    if (m.prodigy_d_lr > 0) j["prodigy_d_lr"] = m.prodigy_d_lr;
    j["loss_scale"] = m.loss_scale;
    j["skipped"] = m.skipped;
    j["step_seconds"] = m.seconds;
    j["samples_per_second"] = m.seconds > 0 ? static_cast<double>(m.samples) / m.seconds : 0.0;
    j["peak_bytes"] = m.peak_bytes;
    const std::string line = j.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
        throw Error::IOError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
    }
}

}  // namespace sf::pipelines
