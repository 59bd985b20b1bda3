#include "graph/progress.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace sf::graph {
namespace {

double rate(int64_t done, double elapsed_seconds) {
    return elapsed_seconds > 0 ? static_cast<double>(done) / elapsed_seconds : 0.0;
}

double percent(int64_t done, int64_t total) {
    return total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
}

std::string counts(int64_t done, int64_t total) {
    return total >= 0 ? fmt::format("{}/{}", done, total) : fmt::format("{} items", done);
}

int terminal_columns(std::FILE* out) {
    winsize ws{};
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    if (const char* env = std::getenv("COLUMNS")) {
        int columns = std::atoi(env);
        if (columns > 0) return columns;
    }
    return 80;
}

}  // namespace

std::string format_duration(double seconds) {
    if (seconds < 0 || !std::isfinite(seconds)) return "?";
    const auto s = static_cast<int64_t>(std::llround(seconds));
    if (s < 60) return fmt::format("{}s", s);
    if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
    return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

double progress_eta_seconds(int64_t done, int64_t total, double elapsed_seconds) {
    if (total < 0) return -1;
    if (done >= total) return 0;
    if (done <= 0 || elapsed_seconds <= 0) return -1;
    return static_cast<double>(total - done) * elapsed_seconds / static_cast<double>(done);
}

std::string format_progress_line(const std::string& name, int64_t done, int64_t total,
                                 double elapsed_seconds) {
    if (total < 0) {
        return fmt::format("{}: {} {:.1f} items/s", name, counts(done, total),
                           rate(done, elapsed_seconds));
    }
    return fmt::format("{}: {} ({:.1f}%) {:.1f} items/s ETA {}", name, counts(done, total),
                       percent(done, total), rate(done, elapsed_seconds),
                       format_duration(progress_eta_seconds(done, total, elapsed_seconds)));
}

std::string format_progress_final(const std::string& name, int64_t done, int64_t total,
                                  double elapsed_seconds) {
    std::string head = total >= 0 ? fmt::format("{}: {} ({:.1f}%)", name, counts(done, total),
                                                percent(done, total))
                                  : fmt::format("{}: {}", name, counts(done, total));
    return fmt::format("{} {:.1f} items/s, done in {}", head, rate(done, elapsed_seconds),
                       format_duration(elapsed_seconds));
}

std::string format_progress_bar(const std::string& name, int64_t done, int64_t total,
                                double elapsed_seconds, int columns) {
    std::string tail = fmt::format(" {}", counts(done, total));
    if (total >= 0) tail += fmt::format(" {:.1f}%", percent(done, total));
    tail += fmt::format(" {:.1f} items/s", rate(done, elapsed_seconds));
    if (total >= 0) {
        tail += " ETA " + format_duration(progress_eta_seconds(done, total, elapsed_seconds));
    }
    const int width = std::max(columns - 1, 1);
    // " [" + bar + "]" costs 3 columns besides the bar itself.
    const int bar_width = std::min(40, width - static_cast<int>(name.size() + tail.size()) - 3);
    std::string line = name;
    if (total > 0 && bar_width >= 5) {
        const int filled = static_cast<int>(std::min<int64_t>(done, total) * bar_width / total);
        line += " [" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "]";
    }
    line += tail;
    if (static_cast<int>(line.size()) > width) line.resize(width);
    return line;
}

ProgressMode resolve_progress_mode(ProgressMode requested, const char* env_value,
                                   bool is_terminal) {
    if (env_value != nullptr) {
        if (std::strcmp(env_value, "plain") == 0) return ProgressMode::kPlain;
        if (std::strcmp(env_value, "bar") == 0) return ProgressMode::kBar;
        if (std::strcmp(env_value, "off") == 0) return ProgressMode::kOff;
    }
    if (requested != ProgressMode::kAuto) return requested;
    return is_terminal ? ProgressMode::kBar : ProgressMode::kPlain;
}

Progress::Progress(std::string name, int64_t total, ProgressOptions options)
    : name_(std::move(name)),
      options_(options),
      mode_(resolve_progress_mode(options.mode, std::getenv("SANAFLOW_PROGRESS"),
                                  isatty(fileno(options.out ? options.out : stderr)) == 1)),
      interval_ns_(static_cast<int64_t>(1e9 * (mode_ == ProgressMode::kBar
                                                   ? options.bar_interval_seconds
                                                   : options.plain_interval_seconds))),
      start_ns_(now_ns()),
      total_(total),
      next_draw_ns_(start_ns_ + interval_ns_) {}

Progress::~Progress() { finish(); }

int64_t Progress::now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void Progress::advance(int64_t n) {
    done_.fetch_add(n, std::memory_order_relaxed);
    if (mode_ == ProgressMode::kOff) return;
    const int64_t now = now_ns();
    if (now < next_draw_ns_.load(std::memory_order_relaxed)) return;
    // Whoever loses the race skips drawing: the winner's line is just as current.
    std::unique_lock<std::mutex> lock(draw_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || finished_ || now < next_draw_ns_.load(std::memory_order_relaxed)) {
        return;
    }
    next_draw_ns_.store(now + interval_ns_, std::memory_order_relaxed);
    draw(false, now);
}

void Progress::finish() {
    std::lock_guard<std::mutex> lock(draw_mutex_);
    if (finished_) return;
    finished_ = true;
    if (mode_ != ProgressMode::kOff) draw(true, now_ns());
}

void Progress::draw(bool final, int64_t now) {
    // Through the logger: quiet (-q) hides progress like any other info line.
    if (options_.out == nullptr && log_level() > LogLevel::kInfo) return;
    const double elapsed = static_cast<double>(now - start_ns_) * 1e-9;
    const int64_t done = done_.load(std::memory_order_relaxed);
    const int64_t total = total_.load(std::memory_order_relaxed);
    std::FILE* out = options_.out ? options_.out : stderr;
    if (mode_ == ProgressMode::kBar) {
        std::string line = format_progress_bar(name_, done, total, elapsed, terminal_columns(out));
        if (options_.out == nullptr) {
            // Through the logger, so log lines printed meanwhile keep the bar intact.
            set_status_line(line, final);
        } else {
            // \x1b[K clears what a longer previous line left to the right.
            std::fprintf(out, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
            std::fflush(out);
        }
        return;
    }
    std::string line = final ? format_progress_final(name_, done, total, elapsed)
                             : format_progress_line(name_, done, total, elapsed);
    if (options_.out == nullptr) {
        log_line(LogLevel::kInfo, line);
    } else {
        std::fprintf(out, "%s\n", line.c_str());
        std::fflush(out);
    }
}

}  // namespace sf::graph
