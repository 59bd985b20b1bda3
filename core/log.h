// Plain line logging to stderr, thread-safe, with an elapsed-time prefix. Progress bars live in
// graph/progress.h; this is for one-off lines.
#pragma once

#include <fmt/format.h>

#include <string>

namespace sf {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& text);

// A status line (a progress bar) kept at the bottom of a terminal on stderr: log lines printed
// while it is shown clear it, print, and redraw it, so the two never garble each other.
// An empty text removes it; `final` prints it once more and ends it with a newline.
void set_status_line(const std::string& text, bool final = false);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kInfo)
        log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kWarn)
        log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
    log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
    if (log_level() <= LogLevel::kDebug)
        log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

// Human-readable byte count: "1.25 GiB".
std::string format_bytes(int64_t bytes);
// "24GiB", "24 GB", "1.5TiB", "800MiB", "123456" -> bytes; kInvalidArgument naming `flag`.
int64_t parse_bytes(const std::string& text, const std::string& flag);

}  // namespace sf
