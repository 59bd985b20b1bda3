// Progress of a long phase: items done of total, items/s and ETA. On a terminal one bar line is
// redrawn in place (at most ~10 times a second); otherwise (CI, a log file) plain lines are
// printed every few seconds, plus a final line. SANAFLOW_PROGRESS=plain|bar|off overrides the
// choice. The formatting is pure functions, so it is tested without a clock or a terminal.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace sf::graph {

enum class ProgressMode { kAuto, kBar, kPlain, kOff };

struct ProgressOptions {
    ProgressMode mode = ProgressMode::kAuto;
    double plain_interval_seconds = 5.0;  // between plain lines
    double bar_interval_seconds = 0.1;    // between bar redraws
    // Where to write. nullptr: stderr, with plain lines going through sf::log_line so that they
    // carry the same time prefix as every other log line.
    std::FILE* out = nullptr;
};

// "25s", "4m05s", "2h03m"; "?" for a negative (unknown) duration.
std::string format_duration(double seconds);
// Seconds left at the average rate so far; -1 when unknown (no total, nothing done yet).
double progress_eta_seconds(int64_t done, int64_t total, double elapsed_seconds);
// "prep/decode: 120/1000 (12.0%) 35.2 items/s ETA 25s"; with total < 0 (unknown):
// "prep/decode: 120 items 35.2 items/s".
std::string format_progress_line(const std::string& name, int64_t done, int64_t total,
                                 double elapsed_seconds);
// "prep/decode: 1000/1000 (100.0%) 35.2 items/s, done in 28s"
std::string format_progress_final(const std::string& name, int64_t done, int64_t total,
                                  double elapsed_seconds);
// "prep/decode [#####.....] 120/1000 12.0% 35.2 items/s ETA 25s", fitted into columns - 1
// characters so that the terminal never wraps it (a wrapped line breaks the \r redraw).
std::string format_progress_bar(const std::string& name, int64_t done, int64_t total,
                                double elapsed_seconds, int columns);
// The mode to use: a valid `env_value` ("plain", "bar", "off") wins, then an explicit request;
// kAuto means a bar on a terminal and plain lines otherwise. Never returns kAuto.
ProgressMode resolve_progress_mode(ProgressMode requested, const char* env_value, bool is_terminal);

// Thread-safe; advance() is one atomic add and a clock read unless a line is due, so stages may
// call it per item.
class Progress {
public:
    Progress(std::string name, int64_t total, ProgressOptions options = {});
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void advance(int64_t n = 1);
    void set_total(int64_t total) { total_.store(total, std::memory_order_relaxed); }
    // Prints the final line (a bar gets its newline). Idempotent; the destructor calls it.
    void finish();

    int64_t done() const { return done_.load(std::memory_order_relaxed); }
    ProgressMode mode() const { return mode_; }

private:
    int64_t now_ns() const;
    void draw(bool final, int64_t now);

    const std::string name_;
    const ProgressOptions options_;
    const ProgressMode mode_;
    const int64_t interval_ns_;
    const int64_t start_ns_;
    std::atomic<int64_t> total_;
    std::atomic<int64_t> done_{0};
    std::atomic<int64_t> next_draw_ns_;
    std::mutex draw_mutex_;
    bool finished_ = false;  // guarded by draw_mutex_
};

}  // namespace sf::graph
