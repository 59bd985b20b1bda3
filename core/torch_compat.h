// Every difference between the LibTorch versions sanaflow builds against lives here. Include it
// only from .cpp files that already include torch headers.
//
// Compiled and tested with, on every CI run (tools/build.sh, tools/test.sh):
//   - Debian 12's LibTorch 1.13.1, CPU only: every `#else` branch below; the whole suite.
//   - PyPI's torch 2.12.1+cu130 (CUDA 13.0), built with SANAFLOW_WITH_CUDA: every 2.x branch
//     and every CUDA branch compile and link; the whole suite runs on the CPU (the gpu tests skip
//     without a device). The CUDA branches have run on a GPU only where the README says so.
// Outside this header the two differ in nothing the tests see; the build differs in two places
// (top-level CMakeLists.txt): PyPI's LibTorch ships fmt's headers, which must not shadow
// Debian's, and finds its CUDA libraries through an RPATH the linker must be pointed at.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/api/include/torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/memory.h"

#if defined(SANAFLOW_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#include <torch/csrc/cuda/memory_snapshot.h>
#define SF_CUDA_MEMORY_SNAPSHOT 1
#endif
#endif

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

#define SF_TORCH_AT_LEAST(major, minor) \
    (TORCH_VERSION_MAJOR > (major) ||   \
     (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator: 2.3 made allocate() non-const and added a pure virtual copy_data().
#if SF_TORCH_AT_LEAST(2, 3)
#define SF_COMPAT_ALLOCATE_CONST
#define SF_COMPAT_ALLOCATOR_COPY_DATA                                               \
    void copy_data(void* dest, const void* src, std::size_t count) const override { \
        std::memcpy(dest, src, count);                                              \
    }
#else
#define SF_COMPAT_ALLOCATE_CONST const
#define SF_COMPAT_ALLOCATOR_COPY_DATA
#endif

namespace sf::compat {

// Whether at::scaled_dot_product_attention (fused flash / memory-efficient kernels) exists.
#if SF_TORCH_AT_LEAST(2, 0)
inline constexpr bool kHasFusedAttention = true;
#else
inline constexpr bool kHasFusedAttention = false;
#endif

// Autocast state per device type (CPU and CUDA only). 2.4 replaced the per-device functions
// (is_cpu_enabled, get_autocast_gpu_dtype, ...) by ones taking the device type and deprecated
// the old ones. The state is thread-local in every version.
inline bool autocast_enabled(c10::DeviceType device_type) {
#if SF_TORCH_AT_LEAST(2, 4)
    return at::autocast::is_autocast_enabled(device_type);
#else
    return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                               : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if SF_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(device_type, enabled);
#else
    if (device_type == c10::DeviceType::CPU) {
        at::autocast::set_cpu_enabled(enabled);
    } else {
        at::autocast::set_enabled(enabled);
    }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if SF_TORCH_AT_LEAST(2, 4)
    return at::autocast::get_autocast_dtype(device_type);
#else
    return device_type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                               : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type, at::ScalarType dtype) {
#if SF_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_dtype(device_type, dtype);
#else
    if (device_type == c10::DeviceType::CPU) {
        at::autocast::set_autocast_cpu_dtype(dtype);
    } else {
        at::autocast::set_autocast_gpu_dtype(dtype);
    }
#endif
}

inline bool cuda_is_available() {
#if defined(SANAFLOW_WITH_CUDA)
    return c10::cuda::device_count() > 0;
#else
    return false;
#endif
}

// The default CUDA generator's state of `device` (a byte tensor), and setting it back; an
// undefined tensor and a no-op when built without CUDA, as the CPU build has no CUDA generator.
inline at::Tensor cuda_rng_state(int device) {
#if defined(SANAFLOW_WITH_CUDA)
    at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
#else
    (void)device;
    return {};
#endif
}

inline void set_cuda_rng_state(int device, const at::Tensor& state) {
#if defined(SANAFLOW_WITH_CUDA)
    at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, device));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
#else
    (void)device;
    (void)state;
#endif
}

inline mem::Stats cuda_allocator_stats(int device) {
#if defined(SANAFLOW_WITH_CUDA)
    if (!cuda_is_available()) return {};
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    const auto& bytes = stats.allocated_bytes[0];  // StatType::AGGREGATE
    return {bytes.current, bytes.peak};
#else
    (void)device;
    return {};
#endif
}

// What the device could still give: the driver's free memory plus what the caching allocator
// holds unallocated. 0 when built without CUDA or no GPU.
inline int64_t cuda_free_bytes(int device) {
#if defined(SANAFLOW_WITH_CUDA)
    if (!cuda_is_available()) return 0;
    const int previous = c10::cuda::current_device();
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    size_t free = 0, total = 0;
    const cudaError_t status = cudaMemGetInfo(&free, &total);
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(previous));
    if (status != cudaSuccess) return 0;
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    const int64_t cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
    return static_cast<int64_t>(free) + std::max<int64_t>(0, cached);
#else
    (void)device;
    return 0;
#endif
}

inline void cuda_reset_peak(int device) {
#if defined(SANAFLOW_WITH_CUDA)
    if (cuda_is_available()) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
#else
    (void)device;
#endif
}

inline void cuda_empty_cache() {
#if defined(SANAFLOW_WITH_CUDA)
    if (cuda_is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// The caching allocator's history (every allocation and free with its C++ stack, the last
// `entries`) and its snapshot in torch.cuda.memory._dump_snapshot's pickle format, which
// pytorch.org/memory_viz draws. A CUDA LibTorch 2.1 or newer has them (kCudaMemorySnapshot).
#if defined(SF_CUDA_MEMORY_SNAPSHOT)
constexpr bool kCudaMemorySnapshot = true;
inline void cuda_record_memory_history(bool on, size_t entries) {
    // The std::optional<std::string> overload ("all": trace and state; a plain string would
    // convert to the older bool overload's first argument).
    if (on) {
        torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                            std::optional<std::string>("all"), "cpp", entries);
    } else {
        torch::cuda::_record_memory_history(std::optional<std::string>());
    }
}
inline std::string cuda_memory_snapshot() { return torch::cuda::_memory_snapshot_pickled(); }
#else
constexpr bool kCudaMemorySnapshot = false;
inline void cuda_record_memory_history(bool, size_t) {}
inline std::string cuda_memory_snapshot() { return {}; }
#endif

// softmax(q k^T / sqrt(d) + bias) v over [B, H, L, d] tensors; `bias` is an additive float mask
// broadcastable to [B, H, Lq, Lk], or undefined for none. 2.0 and later dispatch to the fused
// kernels (flash, memory-efficient) where they apply; 1.13 has no public SDPA, so there it is the
// plain math form, which holds the whole [Lq, Lk] score matrix.
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& bias) {
    const at::Tensor mask = bias.defined() ? bias.to(q.scalar_type()) : at::Tensor();
#if SF_TORCH_AT_LEAST(2, 0)
    return at::scaled_dot_product_attention(
        q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::optional<at::Tensor>());
#else
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    at::Tensor scores = at::matmul(q * scale, k.transpose(-2, -1));  // [B, H, Lq, Lk]
    if (mask.defined()) scores = scores + mask;
    return at::matmul(at::softmax(scores, -1), v);  // [B, H, Lq, d]
#endif
}

// c10d (stages/distributed/): 2.0 split the collectives out of c10d::ProcessGroup into
// c10d::Backend, which ProcessGroupGloo and ProcessGroupNCCL derive from; the store's wire
// protocol changed too (a 1.13 client cannot talk to a 2.x TCPStore, such as torchrun's agent
// store: measured, the 2.x server resets the connection), so a 1.13 build hosts a store of its own.
#if SF_TORCH_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
constexpr bool kC10dStoreSpeaksTorch2 = true;
#else
using C10dBackend = c10d::ProcessGroup;
constexpr bool kC10dStoreSpeaksTorch2 = false;
#endif

}  // namespace sf::compat
