// Mixed-precision autocast scopes, as Python's `with torch.autocast(device_type, dtype, enabled)`:
// LibTorch has the thread-local switches but no RAII guard.
//
//   {
//       AutocastGuard bf16(at::kCPU, at::kBFloat16);
//       at::Tensor loss = step(model, batch);  // matmuls and convs run in bf16
//   }                                          // previous state back, cast cache cleared
//
// AutocastState is a snapshot of every switch, which gradient checkpointing takes in its forward
// and re-enters for the recompute in backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace sf::model {

// The autocast switches of the calling thread for the two device types sanaflow runs on.
struct AutocastState {
    bool cpu_enabled = false;
    at::ScalarType cpu_dtype = at::kBFloat16;
    bool cuda_enabled = false;
    at::ScalarType cuda_dtype = at::kHalf;
    // Whether casts of fp32 leaf weights are cached until the outermost autocast scope exits.
    bool cache_enabled = true;

    static AutocastState capture();
    // Sets every switch; the nesting count and the cast cache are left alone.
    void restore() const;

    bool operator==(const AutocastState& o) const {
        return cpu_enabled == o.cpu_enabled && cpu_dtype == o.cpu_dtype &&
               cuda_enabled == o.cuda_enabled && cuda_dtype == o.cuda_dtype &&
               cache_enabled == o.cache_enabled;
    }
    bool operator!=(const AutocastState& o) const { return !(*this == o); }
};

// Enters an autocast scope for the lifetime of the guard: saves the state, sets it, and counts
// one more nesting level; the destructor restores the saved state and, when the outermost scope
// exits, clears the cast cache (so that cached bf16 copies of the weights do not outlive it,
// and an update to the weights is seen by the next scope). Guards must nest (destroy in reverse
// order of construction) on the thread that made them, as the state is thread-local.
class AutocastGuard {
public:
    // device_type kCPU or kCUDA; dtype kBFloat16 or kHalf when enabled (LibTorch 1.13's CPU
    // autocast takes bf16 only). A bad argument is sf::Error kInvalidArgument and changes nothing.
    AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
    // Enters a whole captured state at once (both device types and the cache switch).
    explicit AutocastGuard(const AutocastState& state);
    ~AutocastGuard();

    AutocastGuard(const AutocastGuard&) = delete;
    AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
    AutocastState previous_;
};

// The number of autocast scopes open on this thread (AutocastGuard and LibTorch's own alike).
int autocast_nesting();

// Autocast caches the bf16 copy of a weight the first time an op casts it, until the outermost
// autocast scope exits. A copy cached in a forward without grad has no grad_fn: a recompute of
// that forward with grad inside the same scope (gradient checkpointing's backward) would pick it
// up and the weight would get no gradient. Such forwards run with the cache off.
class CastCacheOff {
public:
    CastCacheOff();
    ~CastCacheOff();
    CastCacheOff(const CastCacheOff&) = delete;
    CastCacheOff& operator=(const CastCacheOff&) = delete;

private:
    bool previous_;
};

// `t` as autocast casts the inputs of a low-precision op (matmul, linear, conv) on t's device:
// a floating tensor other than double in the autocast dtype when autocast is on there, else t
// itself. Differentiable. Casting an input once that several ops share saves a copy per op.
at::Tensor autocast_cast(const at::Tensor& t);

// Autocast off for the guard's lifetime, whatever scope is open: for kernels that do their own
// fp32 math, whose matmuls autocast would otherwise recast to the low-precision dtype.
struct NoAutocast {
    c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

}  // namespace sf::model
