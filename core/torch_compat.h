// Every difference between the LibTorch versions sanaflow builds against lives here: Debian's
// CPU LibTorch 1.13 on development machines and CI, a CUDA LibTorch 2.x on GPU machines.
// Include it only from .cpp files that already include torch headers.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cmath>
#include <cstring>

#include "core/memory.h"

#if defined(SANAFLOW_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#define SF_TORCH_AT_LEAST(major, minor) \
    (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator: 2.3 made allocate() non-const and added a pure virtual copy_data().
#if SF_TORCH_AT_LEAST(2, 3)
#define SF_COMPAT_ALLOCATE_CONST
#define SF_COMPAT_ALLOCATOR_COPY_DATA                                                  \
    void copy_data(void* dest, const void* src, std::size_t count) const override {    \
        std::memcpy(dest, src, count);                                                 \
    }
#else
#define SF_COMPAT_ALLOCATE_CONST const
#define SF_COMPAT_ALLOCATOR_COPY_DATA
#endif

namespace sf::compat {

inline bool cuda_is_available() {
#if defined(SANAFLOW_WITH_CUDA)
    return c10::cuda::device_count() > 0;
#else
    return false;
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

}  // namespace sf::compat
