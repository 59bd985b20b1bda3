// Memory meter: where the memory goes, on CPU and CUDA alike.
//
// On CPU a counting allocator (installed with install_counting_allocator()) wraps LibTorch's CPU
// allocator and tracks current and peak bytes of tensor memory, like
// torch.cuda.max_memory_allocated does on CUDA; it can enforce a byte budget by throwing
// c10::OutOfMemoryError, so out-of-memory handling is testable without a GPU. On CUDA the caching
// allocator's own statistics are read. Marks record the numbers at named points
// ("encode_vae/after load") and print as a per-stage table.
//
// This header is torch-free so that any unit may include it cheaply.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace sf::mem {

struct Stats {
    int64_t current = 0;  // bytes live now
    int64_t peak = 0;     // most bytes live at once since the last reset_peak()
};

// Wraps the default CPU allocator with the counting one. Idempotent and thread-safe. Tensors
// allocated before the call are not counted (their frees are not either).
void install_counting_allocator();
bool counting_allocator_installed();

// Counted CPU tensor bytes. Zero until install_counting_allocator() runs.
Stats cpu_stats();
// The most counted CPU tensor bytes live at once since the previous call (or since the allocator
// was installed), and a new interval begun at the current bytes: the memory timeline's sampler
// reads it, so a peak between two samples is seen. Independent of reset_peak().
int64_t take_interval_peak();
// Number of live CPU allocations made through the counting allocator.
int64_t cpu_live_allocations();

// Byte budget on counted CPU tensor memory: an allocation that would take the current total past
// `bytes` throws c10::OutOfMemoryError (caught as std::exception or c10::Error). 0 = no budget.
void set_cpu_budget(int64_t bytes);
int64_t cpu_budget();

// Sets a budget for the lifetime of the guard and restores the previous one after.
class BudgetGuard {
public:
    explicit BudgetGuard(int64_t bytes) : previous_(cpu_budget()) { set_cpu_budget(bytes); }
    ~BudgetGuard() { set_cpu_budget(previous_); }
    BudgetGuard(const BudgetGuard&) = delete;
    BudgetGuard& operator=(const BudgetGuard&) = delete;

private:
    int64_t previous_;
};

// Blocks of 1 MiB and more freed by the counting allocator are pooled for reuse (by size class)
// rather than returned to the C library, which would unmap them and fault their pages back in on
// the next forward; the pool is bounded (default 4 GiB, SANAFLOW_CPU_POOL_MB) and frees pooled
// blocks before mapping new ones, so it raises the peak resident set by 1/16 of the peak of live
// blocks at most. Pooled bytes are not counted in cpu_stats(), like the CUDA allocator's
// reserved-but-free memory.
int64_t cpu_pooled_bytes();
void set_cpu_pool_limit(int64_t bytes);  // 0 disables pooling
int64_t cpu_pool_limit();

// Hands memory held for reuse back to the system: the CPU pool and the CUDA caching allocator.
void empty_cache();
// empty_cache() at a phase boundary (a model freed, training set up or done, after running out
// of memory), logged with what it gave back: "memory released at <where>: ...". Returns the CPU
// pool's bytes released.
int64_t release_memory(const std::string& where);

// CUDA caching-allocator statistics for `device`; zeros when built without CUDA or no GPU.
Stats cuda_stats(int device = 0);
bool cuda_available();
// The memory `device` could still give (driver free + the caching allocator's unallocated
// blocks); 0 without CUDA.
int64_t cuda_free_bytes(int device = 0);
// Returns cached blocks to the driver. A no-op without CUDA.
void cuda_empty_cache();

// --memory_snapshot: from start_cuda_history() on, the CUDA caching allocator records every
// allocation and free with its C++ stack; write_cuda_snapshot(path) writes its segments and
// that history as torch.cuda.memory._dump_snapshot does (a pickle: pytorch.org/memory_viz draws
// the timeline with its peak and each block's stack) and stops recording. Only a CUDA LibTorch
// 2.1 or newer on a machine with a GPU can: elsewhere require_cuda_snapshot() and both are
// kInvalidArgument saying which is missing.
void require_cuda_snapshot();
void start_cuda_history();
void write_cuda_snapshot(const std::string& path);

// Resets the peaks of the CPU counter, the CUDA allocator and (where the kernel allows) the
// process's peak resident set, so that the next peak belongs to the next phase.
void reset_peak();

// Resident set size of the process, from /proc/self/status (VmRSS, VmHWM).
int64_t rss_bytes();
int64_t peak_rss_bytes();

struct Mark {
    std::string stage;
    std::string point;
    double seconds = 0;  // since the process started
    Stats cpu;
    Stats cuda;
    int64_t rss = 0;
    int64_t peak_rss = 0;
};

// A thread-safe list of marks. `mark()` also logs one line when logging is on.
class MemoryLog {
public:
    Mark mark(const std::string& stage, const std::string& point);
    std::vector<Mark> marks() const;
    void clear();
    // One row per mark: stage, point, tensor current/peak, cuda current/peak, rss, peak rss.
    std::string table() const;
    void set_verbose(bool verbose) { verbose_ = verbose; }

private:
    mutable std::mutex mutex_;
    std::vector<Mark> marks_;
    bool verbose_ = true;
};

// The process-wide log that stages write to.
MemoryLog& memory_log();

}  // namespace sf::mem
