// OUTPUT_DIR/metrics.jsonl: one JSON line per optimizer step, for people and plotting tools:
//
//     {"step": 12, "loss": 0.412, "lr": 1e-4, "grad_norm": 0.93, "loss_scale": 1,
//      "skipped": false, "step_seconds": 0.21, "samples_per_second": 38.1,
//      "peak_bytes": {"data": ..., "forward": ..., "backward": ..., "optimizer": ...}}
//
// Each line is flushed as it is written, so a killed run keeps every finished step. A resumed run
// first drops the lines past the step it resumes from (those steps are trained again), so the file
// always holds each step once; a line cut short by a kill is dropped too.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace sf::pipelines {

constexpr const char* kMetricsFile = "metrics.jsonl";

// One step's line.
struct StepMetrics {
    int64_t step = 0;
    double loss = 0;  // non-finite ones are written as null
    double lr = 0;
    double grad_norm = 0;
    double prodigy_d_lr = 0;  // --optimizer prodigy: d x lr (written only then)
    double loss_scale = 1;
    bool skipped = false;
    double seconds = 0;   // wall time of the step, data loading included
    int64_t samples = 0;  // samples the step trained on (micro-batches x batch)
    std::map<std::string, int64_t> peak_bytes;  // phase -> its peak so far
};

class MetricsLog {
public:
    // Opens OUTPUT_DIR/metrics.jsonl keeping the lines of steps 1..first_step.
    MetricsLog(const std::string& output_dir, int64_t first_step);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    void append(const StepMetrics& m);
    const std::string& path() const { return path_; }

private:
    std::string path_;
    std::FILE* file_ = nullptr;
};

}  // namespace sf::pipelines
