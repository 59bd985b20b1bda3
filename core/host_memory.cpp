#include "core/host_memory.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/torch_compat.h"

namespace sf::mem {
namespace {

std::atomic<int64_t> g_host_current{0}, g_host_peak{0};
constexpr size_t kAlign = 64;

void host_delete(void* ctx) {
    auto* block = static_cast<int64_t*>(ctx);  // the size, then the data kAlign bytes on
    g_host_current -= block[0];
    std::free(block);
}

// The C library's memory, never the registered CPU allocator (the counting one).
class HostAllocator final : public c10::Allocator {
public:
    c10::DataPtr allocate(size_t bytes) SF_COMPAT_ALLOCATE_CONST override {
        const size_t size = kAlign + (bytes + kAlign - 1) / kAlign * kAlign;
        void* block = std::aligned_alloc(kAlign, size);
        if (!block) throw std::bad_alloc();
        static_cast<int64_t*>(block)[0] = static_cast<int64_t>(bytes);
        const int64_t now = g_host_current += static_cast<int64_t>(bytes);
        for (int64_t peak = g_host_peak.load(); now > peak;)
            if (g_host_peak.compare_exchange_weak(peak, now)) break;
        return {static_cast<char*>(block) + kAlign, block, &host_delete, c10::Device(c10::kCPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
    SF_COMPAT_ALLOCATOR_COPY_DATA
};

HostAllocator& host_allocator() {
    static HostAllocator allocator;
    return allocator;
}

at::Tensor host_empty_like(const at::Tensor& t) {
    at::Tensor out = at::detail::empty_generic(t.sizes(), &host_allocator(),
                                               c10::DispatchKeySet(c10::DispatchKey::CPU),
                                               t.scalar_type(), c10::nullopt);
    if (!t.is_contiguous()) out = out.as_strided(t.sizes(), t.strides());
    return out;
}

}  // namespace

at::Tensor to_host(const at::Tensor& t, bool pinned) {
    if (pinned)
        return t.to(c10::Device(c10::kCPU), /*non_blocking=*/false, /*copy=*/true).pin_memory();
    at::Tensor out = host_empty_like(t.contiguous());
    out.copy_(t);
    return out;
}

at::Tensor host_zeros_like(const at::Tensor& t) {
    at::Tensor out = host_empty_like(t.contiguous());
    out.zero_();
    return out;
}

bool in_host_memory(const at::Tensor& t) {
    return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &host_delete;
}

Stats host_stats() { return {g_host_current.load(), g_host_peak.load()}; }
void reset_host_peak() { g_host_peak = g_host_current.load(); }

}  // namespace sf::mem
