#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace sf {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mutex;
std::string g_status;  // guarded by g_mutex
const auto g_start = std::chrono::steady_clock::now();

}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, const std::string& text) {
    static const char* kTags[] = {"debug", "info", "warn", "error"};
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
    std::lock_guard<std::mutex> lock(g_mutex);
    // \x1b[K clears what the status line left to the right.
    if (!g_status.empty()) std::fputs("\r\x1b[K", stderr);
    std::fprintf(stderr, "[%8.2fs %s] %s\n", t, kTags[static_cast<int>(level)], text.c_str());
    if (!g_status.empty()) std::fputs(g_status.c_str(), stderr);
    std::fflush(stderr);
}

void set_status_line(const std::string& text, bool final) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (text.empty() && g_status.empty()) return;
    std::fprintf(stderr, "\r%s\x1b[K%s", text.c_str(), final ? "\n" : "");
    std::fflush(stderr);
    g_status = final ? std::string() : text;
}

std::string format_bytes(int64_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    return fmt::format("{}{:.{}f} {}", bytes < 0 ? "-" : "", v, u == 0 ? 0 : 2, units[u]);
}

}  // namespace sf
