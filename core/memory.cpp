#include "core/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>

#include "core/log.h"
#include "core/torch_compat.h"

namespace sf::mem {
namespace {

// Every block carries a header of one alignment unit in front of the data, holding its size.
// The DataPtr's context is the data pointer itself: oneDNN's bf16 kernels assert that context ==
// data (a context that differs makes them fail), and raw_deleter() must then work from the data
// pointer alone, which the header allows.
constexpr size_t kHeader = c10::gAlignment;

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_budget{0};

void update_peak(int64_t now) {
    int64_t prev = g_peak.load(std::memory_order_relaxed);
    while (now > prev && !g_peak.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
    }
}

void counting_free(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    int64_t size;
    std::memcpy(&size, base, sizeof(size));
    g_current.fetch_sub(size, std::memory_order_relaxed);
    g_live.fetch_sub(1, std::memory_order_relaxed);
    c10::free_cpu(base);
}

class CountingCPUAllocator final : public c10::Allocator {
public:
    c10::DataPtr allocate(size_t nbytes) SF_COMPAT_ALLOCATE_CONST override {
        const int64_t size = static_cast<int64_t>(nbytes);
        const int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
        const int64_t budget = g_budget.load(std::memory_order_relaxed);
        if (budget > 0 && now > budget) {
            g_current.fetch_sub(size, std::memory_order_relaxed);
            TORCH_CHECK_WITH(OutOfMemoryError, false, "sanaflow CPU byte budget exceeded: tried to allocate ",
                             nbytes, " bytes with ", now - size, " of ", budget, " bytes in use");
        }
        void* base = nullptr;
        try {
            base = c10::alloc_cpu(nbytes + kHeader);
        } catch (...) {
            g_current.fetch_sub(size, std::memory_order_relaxed);
            throw;
        }
        update_peak(now);
        g_live.fetch_add(1, std::memory_order_relaxed);
        std::memcpy(base, &size, sizeof(size));
        void* data = static_cast<char*>(base) + kHeader;
        return {data, data, &counting_free, c10::Device(c10::DeviceType::CPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &counting_free; }
    SF_COMPAT_ALLOCATOR_COPY_DATA
};

CountingCPUAllocator g_counting;
std::once_flag g_install_once;
std::atomic<bool> g_installed{false};

int64_t read_status_kb(const char* key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    const size_t n = std::strlen(key);
    while (std::getline(in, line)) {
        if (line.compare(0, n, key) == 0) return std::stoll(line.substr(n + 1)) * 1024;
    }
    return 0;
}

const auto g_process_start = std::chrono::steady_clock::now();

}  // namespace

void install_counting_allocator() {
    std::call_once(g_install_once, [] {
        // Priority above the default's so a later default registration does not replace it.
        c10::SetCPUAllocator(&g_counting, /*priority=*/100);
        g_installed = true;
    });
}

bool counting_allocator_installed() { return g_installed.load(); }

Stats cpu_stats() { return {g_current.load(), g_peak.load()}; }
int64_t cpu_live_allocations() { return g_live.load(); }
void set_cpu_budget(int64_t bytes) { g_budget = bytes < 0 ? 0 : bytes; }
int64_t cpu_budget() { return g_budget.load(); }

Stats cuda_stats(int device) { return compat::cuda_allocator_stats(device); }
bool cuda_available() { return compat::cuda_is_available(); }
void cuda_empty_cache() { compat::cuda_empty_cache(); }

void reset_peak() {
    g_peak = g_current.load();
    compat::cuda_reset_peak(0);
    // "5" resets VmHWM to the current RSS (Linux >= 4.0). Harmless where it is refused.
    std::ofstream("/proc/self/clear_refs") << "5";
}

int64_t rss_bytes() { return read_status_kb("VmRSS:"); }
int64_t peak_rss_bytes() { return read_status_kb("VmHWM:"); }

Mark MemoryLog::mark(const std::string& stage, const std::string& point) {
    Mark m;
    m.stage = stage;
    m.point = point;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
    m.cpu = cpu_stats();
    m.cuda = cuda_stats(0);
    m.rss = rss_bytes();
    m.peak_rss = peak_rss_bytes();
    if (verbose_) {
        std::string cuda = cuda_available() ? fmt::format(" cuda {} (peak {})", format_bytes(m.cuda.current),
                                                          format_bytes(m.cuda.peak))
                                            : "";
        log_info("memory {}/{}: tensors {} (peak {}){} rss {} (peak {})", stage, point,
                 format_bytes(m.cpu.current), format_bytes(m.cpu.peak), cuda, format_bytes(m.rss),
                 format_bytes(m.peak_rss));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    marks_.push_back(m);
    return m;
}

std::vector<Mark> MemoryLog::marks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return marks_;
}

void MemoryLog::clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    marks_.clear();
}

std::string MemoryLog::table() const {
    auto rows = marks();
    std::string out = fmt::format("{:<16} {:<22} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "stage",
                                  "point", "tensors", "tensor peak", "cuda", "cuda peak", "rss", "rss peak");
    for (const Mark& m : rows) {
        out += fmt::format("{:<16} {:<22} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", m.stage, m.point,
                           format_bytes(m.cpu.current), format_bytes(m.cpu.peak), format_bytes(m.cuda.current),
                           format_bytes(m.cuda.peak), format_bytes(m.rss), format_bytes(m.peak_rss));
    }
    return out;
}

MemoryLog& memory_log() {
    static MemoryLog log;
    return log;
}

}  // namespace sf::mem
