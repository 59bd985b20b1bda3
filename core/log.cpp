#include "core/log.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "core/error.h"

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

int64_t parse_bytes(const std::string& text, const std::string& flag) {
    size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
        ++i;
    std::string unit = text.substr(i);
    unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    const std::map<std::string, double> units = {{"", 1},
                                                 {"b", 1},
                                                 {"kb", 1e3},
                                                 {"mb", 1e6},
                                                 {"gb", 1e9},
                                                 {"tb", 1e12},
                                                 {"kib", 1024.0},
                                                 {"mib", 1048576.0},
                                                 {"gib", 1073741824.0},
                                                 {"tib", 1099511627776.0}};
    double value = 0;
    try {
        value = i > 0 ? std::stod(text.substr(0, i)) : -1;
    } catch (const std::exception&) {
        value = -1;
    }
    const auto u = units.find(unit);
    if (value <= 0 || u == units.end() || !std::isfinite(value * u->second) ||
        value * u->second > 9e18) {
        throw Error::InvalidArgument(fmt::format(
            "{}: {} is not a size (a positive number with B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, "
            "e.g. 24GiB)",
            flag, text.substr(0, 40)));
    }
    return static_cast<int64_t>(value * u->second);
}

}  // namespace sf
