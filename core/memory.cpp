#include "core/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/timeline.h"
#include "core/torch_compat.h"

namespace sf::mem {
namespace {

// Every block carries a header of one alignment unit in front of the data, holding its counted
// size and its capacity. The DataPtr's context is the data pointer itself: oneDNN's bf16 kernels
// assert that context == data (a context that differs makes them fail), and raw_deleter() must
// then work from the data pointer alone, which the header allows.
constexpr size_t kHeader = c10::gAlignment;
static_assert(kHeader >= 2 * sizeof(int64_t), "the block header holds two sizes");

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_interval_peak{0};
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_budget{0};

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
    int64_t prev = peak.load(std::memory_order_relaxed);
    while (now > prev && !peak.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
    }
}

void update_peak(int64_t now) {
    raise_to(g_peak, now);
    raise_to(g_interval_peak, now);
}

// Large blocks are mapped by the allocator itself, with transparent huge pages where the kernel
// offers them, and kept for reuse instead of being unmapped on free. glibc maps each block above
// its mmap threshold (at most 32 MiB) afresh and unmaps it on free, so a model whose activations
// are that large faults in every 4 KiB page of every activation, every forward: measured with the
// tiny DC-AE at batch 4 and 512 px (bench_prep), 1.6 million page faults for 8 images and several
// times the time of batch 1.
//
// Blocks are rounded up to a size class and pooled per class. The pool keeps the process within
// 1/kSlack of the largest its live blocks have been: a miss that would take live + pooled bytes
// past the peak of live bytes (since the last empty_cache) and that slack first unmaps pooled
// blocks. A miss never maps a block beside resident pages it could use:
// - it takes the head of a larger pooled block when there is one, and the tail stays pooled as a
//   block of its own: both are resident already, so neither tensor takes page faults;
// - with no larger block it grows the largest smaller one (mremap: its pages stay resident, only
//   the new tail faults in).
// Measured with memory_ablation all (micro-batches of one, bf16, checkpointing; 3 steps and the
// warm-up): unmapping the tails and no slack took 364 thousand page faults at 1024 px and 1.18
// million at 2048 px (each step unmapped and faulted in again 1.7 GiB at 2048 px); keeping the
// tails with a slack of 1/16, 282 and 644 thousand, for 3% more resident memory (905 against 882
// MB, 1028 against 997 MB); a slack of 1/8 took 268 and 544 thousand for 6% more.
constexpr int64_t kSlack = 16;
constexpr int64_t kPoolMin = int64_t{1} << 20;  // smaller blocks are glibc's (its bins reuse them)
constexpr int64_t kHugePage = int64_t{2} << 20;

int64_t size_class(int64_t nbytes) {
    const int64_t step = nbytes < 8 * kHugePage ? (int64_t{64} << 10) : kHugePage;
    return (nbytes + kHeader + step - 1) / step * step;  // the capacity includes the header
}

void* map_block(int64_t capacity) {
    void* base = ::mmap(nullptr, static_cast<size_t>(capacity), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK_WITH(OutOfMemoryError, base != MAP_FAILED, "sanaflow CPU allocator: cannot map ",
                     capacity, " bytes: ", std::strerror(errno));
    if (capacity >= kHugePage) ::madvise(base, static_cast<size_t>(capacity), MADV_HUGEPAGE);
    return base;
}

void unmap_block(void* base, int64_t capacity) { ::munmap(base, static_cast<size_t>(capacity)); }

class BlockPool {
public:
    // A block of at least `capacity` bytes; `capacity` is updated to the block's own size.
    void* allocate(int64_t& capacity) {
        int64_t excess = 0;
        std::pair<char*, int64_t> trim{nullptr, 0};  // the tail of a reused block to unmap
        std::pair<char*, int64_t> grow{nullptr, 0};  // a smaller pooled block to grow
        {
            std::lock_guard<std::mutex> lock(mutex_);
            // Best fit among pooled blocks up to 1/8 larger: the sizes of one forward pass differ
            // from those of the next batch shape, and an exact match would miss there; but a
            // block reused for a smaller tensor keeps its touched pages resident, so a looser fit
            // raises the resident set (memory_ablation, all remedies at 4096 px: fit 2x 1.30 GiB,
            // 1/8 1.22 GiB, no pool 1.21 GiB; the step 19.9, 23.1 and 37.9 s).
            for (auto it = free_.lower_bound(capacity);
                 it != free_.end() && it->first <= capacity + capacity / 8; ++it) {
                if (it->second.empty()) continue;
                void* base = it->second.back();
                it->second.pop_back();
                capacity = it->first;
                pooled_ -= capacity;
                live_ += capacity;
                peak_live_ = std::max(peak_live_, live_);
                return base;
            }
            // No close fit: the head of the smallest larger block. Its pages are resident
            // already, so the tensor takes no page faults. The tail stays pooled as a block of
            // its own (resident too, for a later tensor), or is unmapped when it is too small.
            for (auto it = free_.upper_bound(capacity + capacity / 8); it != free_.end(); ++it) {
                if (it->second.empty()) continue;
                char* base = static_cast<char*>(it->second.back());
                it->second.pop_back();
                pooled_ -= it->first;
                live_ += capacity;
                peak_live_ = std::max(peak_live_, live_);
                const int64_t tail = it->first - capacity;
                if (tail < kPoolMin) {
                    trim = {base + capacity, tail};
                    break;
                }
                free_[tail].push_back(base + capacity);
                pooled_ += tail;
                return base;
            }
            if (trim.first == nullptr) {
                // No larger block: the largest smaller one is grown (below), so its resident
                // pages are reused and only the new tail faults in.
                for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
                    if (it->second.empty()) continue;
                    grow = {static_cast<char*>(it->second.back()), it->first};
                    it->second.pop_back();
                    pooled_ -= it->first;
                    break;
                }
                live_ += capacity;
                peak_live_ = std::max(peak_live_, live_);
                excess = live_ + pooled_ - peak_live_ - peak_live_ / kSlack;
            }
        }
        if (trim.first != nullptr) {
            unmap_block(trim.first, trim.second);
            return trim.first - capacity;
        }
        if (excess > 0) release(excess);
        if (grow.first != nullptr) {
            void* base = ::mremap(grow.first, static_cast<size_t>(grow.second),
                                  static_cast<size_t>(capacity), MREMAP_MAYMOVE);
            if (base != MAP_FAILED) {
                ::madvise(base, static_cast<size_t>(capacity), MADV_HUGEPAGE);
                return base;
            }
            unmap_block(grow.first, grow.second);  // and map afresh
        }
        try {
            return map_block(capacity);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            live_ -= capacity;
            throw;
        }
    }

    void free(void* base, int64_t capacity) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            live_ -= capacity;
            if (pooled_ + capacity <= limit_) {
                free_[capacity].push_back(base);
                pooled_ += capacity;
                return;
            }
        }
        unmap_block(base, capacity);
    }

    // Unmaps pooled blocks totalling at least `bytes` (all of them when fewer are pooled),
    // largest classes first.
    void release(int64_t bytes) {
        std::vector<std::pair<void*, int64_t>> victims;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            int64_t freed = 0;
            for (auto it = free_.rbegin(); it != free_.rend() && freed < bytes; ++it) {
                while (!it->second.empty() && freed < bytes) {
                    victims.emplace_back(it->second.back(), it->first);
                    it->second.pop_back();
                    freed += it->first;
                }
            }
            pooled_ -= freed;
        }
        for (const auto& [base, capacity] : victims) unmap_block(base, capacity);
    }

    // Unmaps every pooled block, and starts a new peak from the live bytes.
    void empty() {
        release(INT64_MAX);
        std::lock_guard<std::mutex> lock(mutex_);
        peak_live_ = live_;
    }

    int64_t pooled() {
        std::lock_guard<std::mutex> lock(mutex_);
        return pooled_;
    }
    void set_limit(int64_t bytes) {
        int64_t excess = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            limit_ = bytes;
            excess = pooled_ - bytes;
        }
        if (excess > 0) release(excess);
    }
    int64_t limit() {
        std::lock_guard<std::mutex> lock(mutex_);
        return limit_;
    }

private:
    std::mutex mutex_;
    std::map<int64_t, std::vector<void*>> free_;  // capacity -> blocks
    int64_t live_ = 0;                            // capacity of the large blocks in use
    int64_t peak_live_ = 0;                       // the most live_ has been since the last empty()
    int64_t pooled_ = 0;
    int64_t limit_ = default_limit();

    static int64_t default_limit() {
        if (const char* env = std::getenv("SANAFLOW_CPU_POOL_MB")) return std::atoll(env) << 20;
        return int64_t{4} << 30;
    }
};

BlockPool& pool() {
    static BlockPool* p = new BlockPool();  // never destroyed: tensors may outlive main()
    return *p;
}

void counting_free(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    int64_t size, capacity;
    std::memcpy(&size, base, sizeof(size));
    std::memcpy(&capacity, base + sizeof(size), sizeof(capacity));
    g_current.fetch_sub(size, std::memory_order_relaxed);
    g_live.fetch_sub(1, std::memory_order_relaxed);
    if (capacity > 0) {
        pool().free(base, capacity);
    } else {
        c10::free_cpu(base);
    }
}

// A block with its header; capacity 0 in the header marks a small block from the C library.
void* allocate_block(int64_t size) {
    int64_t capacity = size >= kPoolMin ? size_class(size) : 0;
    void* base = capacity > 0 ? pool().allocate(capacity)
                              : c10::alloc_cpu(static_cast<size_t>(size) + kHeader);
    std::memcpy(base, &size, sizeof(size));
    std::memcpy(static_cast<char*>(base) + sizeof(size), &capacity, sizeof(capacity));
    return base;
}

class CountingCPUAllocator final : public c10::Allocator {
public:
    c10::DataPtr allocate(size_t nbytes) SF_COMPAT_ALLOCATE_CONST override {
        const int64_t size = static_cast<int64_t>(nbytes);
        const int64_t now = g_current.fetch_add(size, std::memory_order_relaxed) + size;
        const int64_t budget = g_budget.load(std::memory_order_relaxed);
        if (budget > 0 && now > budget) {
            g_current.fetch_sub(size, std::memory_order_relaxed);
            TORCH_CHECK_WITH(OutOfMemoryError, false,
                             "sanaflow CPU byte budget exceeded: tried to allocate ", nbytes,
                             " bytes with ", now - size, " of ", budget, " bytes in use");
        }
        void* base = nullptr;
        try {
            base = allocate_block(size);
        } catch (...) {
            g_current.fetch_sub(size, std::memory_order_relaxed);
            throw;
        }
        update_peak(now);
        g_live.fetch_add(1, std::memory_order_relaxed);
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

int64_t take_interval_peak() {
    const int64_t peak = g_interval_peak.exchange(g_current.load());
    // An allocation between the two loads may have raised the current bytes past the new start.
    raise_to(g_interval_peak, g_current.load());
    return std::max(peak, g_current.load());
}
int64_t cpu_live_allocations() { return g_live.load(); }
void set_cpu_budget(int64_t bytes) { g_budget = bytes < 0 ? 0 : bytes; }
int64_t cpu_budget() { return g_budget.load(); }

Stats cuda_stats(int device) { return compat::cuda_allocator_stats(device); }
bool cuda_available() { return compat::cuda_is_available(); }
int64_t cuda_free_bytes(int device) { return compat::cuda_free_bytes(device); }
void cuda_empty_cache() { compat::cuda_empty_cache(); }

void require_cuda_snapshot() {
    if (!compat::kCudaMemorySnapshot || !compat::cuda_is_available()) {
        throw Error::InvalidArgument(
            compat::kCudaMemorySnapshot
                ? "--memory_snapshot records the CUDA caching allocator: no CUDA device here"
                : "--memory_snapshot records the CUDA caching allocator: this build's LibTorch "
                  "has none (a CUDA LibTorch 2.1 or newer has: tools/build.sh --torch2)");
    }
}

namespace {
constexpr size_t kSnapshotEntries = 200000;  // allocations and frees kept (the newest)
}  // namespace

void start_cuda_history() {
    require_cuda_snapshot();
    compat::cuda_record_memory_history(true, kSnapshotEntries);
}

void write_cuda_snapshot(const std::string& path) {
    require_cuda_snapshot();
    const std::string bytes = compat::cuda_memory_snapshot();
    compat::cuda_record_memory_history(false, 0);
    const std::string temp = path + ".tmp";
    {
        std::ofstream out(temp, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!out.flush()) throw Error::IOError("cannot write the memory snapshot " + temp);
    }
    std::error_code ec;
    std::filesystem::rename(temp, path, ec);
    if (ec)
        throw Error::IOError("cannot rename the memory snapshot to " + path + ": " + ec.message());
}

int64_t cpu_pooled_bytes() { return pool().pooled(); }
void set_cpu_pool_limit(int64_t bytes) { pool().set_limit(bytes < 0 ? 0 : bytes); }
int64_t cpu_pool_limit() { return pool().limit(); }

void empty_cache() {
    pool().empty();
    compat::cuda_empty_cache();
}

int64_t release_memory(const std::string& where) {
    const int64_t pooled = pool().pooled();
    const int64_t rss_before = rss_bytes();
    empty_cache();
    log_info("memory released at {}: {} pooled, rss {} -> {}", where, format_bytes(pooled),
             format_bytes(rss_before), format_bytes(rss_bytes()));
    return pooled;
}

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
    m.seconds = process_seconds();
    m.cpu = cpu_stats();
    m.cuda = cuda_stats(0);
    m.rss = rss_bytes();
    m.peak_rss = peak_rss_bytes();
    if (verbose_) {
        std::string cuda = cuda_available()
                               ? fmt::format(" cuda {} (peak {})", format_bytes(m.cuda.current),
                                             format_bytes(m.cuda.peak))
                               : "";
        log_info("memory {}/{}: tensors {} (peak {}){} rss {} (peak {})", stage, point,
                 format_bytes(m.cpu.current), format_bytes(m.cpu.peak), cuda, format_bytes(m.rss),
                 format_bytes(m.peak_rss));
    }
    if (timeline().recording()) timeline().add_mark(m);
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
    std::string out =
        fmt::format("{:<16} {:<22} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "stage", "point",
                    "tensors", "tensor peak", "cuda", "cuda peak", "rss", "rss peak");
    for (const Mark& m : rows) {
        out += fmt::format("{:<16} {:<22} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", m.stage,
                           m.point, format_bytes(m.cpu.current), format_bytes(m.cpu.peak),
                           format_bytes(m.cuda.current), format_bytes(m.cuda.peak),
                           format_bytes(m.rss), format_bytes(m.peak_rss));
    }
    return out;
}

MemoryLog& memory_log() {
    static MemoryLog log;
    return log;
}

}  // namespace sf::mem
