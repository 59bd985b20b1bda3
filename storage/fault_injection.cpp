#include "storage/fault_injection.h"

#include <sys/statvfs.h>

#include <atomic>
#include <filesystem>
#include <mutex>

namespace sf::storage::faults {
namespace {

std::atomic<bool> armed{false};
std::mutex mutex;
Fault current;
int passed = 0, failed = 0;
std::optional<uint64_t> free_override;

}  // namespace

void arm(const Fault& fault) {
    std::lock_guard<std::mutex> lock(mutex);
    current = fault;
    passed = failed = 0;
    armed.store(true);
}

void disarm() {
    std::lock_guard<std::mutex> lock(mutex);
    armed.store(false);
}

int fired() {
    std::lock_guard<std::mutex> lock(mutex);
    return failed;
}

int check(Op op, std::string_view path) {
    if (!armed.load(std::memory_order_relaxed)) return 0;
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed.load() || op != current.op) return 0;
    if (!current.path_contains.empty() && path.find(current.path_contains) == std::string::npos)
        return 0;
    if (passed < current.skip) {
        ++passed;
        return 0;
    }
    if (current.times >= 0 && failed >= current.times) return 0;
    ++failed;
    return current.error;
}

std::optional<uint64_t> free_bytes(const std::string& path) {
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (free_override) return free_override;
    }
    std::filesystem::path p = path;
    std::error_code ec;
    while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
    struct statvfs st {};
    if (::statvfs(p.empty() ? "." : p.c_str(), &st) != 0) return std::nullopt;
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

void set_free_bytes(std::optional<uint64_t> bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    free_override = bytes;
}

ScopedFault::ScopedFault(const Fault& fault, std::optional<uint64_t> free) {
    arm(fault);
    set_free_bytes(free);
}

ScopedFault::~ScopedFault() {
    disarm();
    set_free_bytes(std::nullopt);
}

}  // namespace sf::storage::faults
