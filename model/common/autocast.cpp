#include "model/common/autocast.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/torch_compat.h"

namespace sf::model {

AutocastState AutocastState::capture() {
    AutocastState s;
    s.cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU);
    s.cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU);
    s.cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA);
    s.cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
}

void AutocastState::restore() const {
    compat::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    compat::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled)
    : previous_(AutocastState::capture()) {
    if (device_type != c10::DeviceType::CPU && device_type != c10::DeviceType::CUDA) {
        throw Error::InvalidArgument(
            fmt::format("AutocastGuard: device type {} has no autocast "
                        "here (CPU and CUDA do)",
                        c10::DeviceTypeName(device_type)));
    }
    if (enabled && dtype != at::kBFloat16 && dtype != at::kHalf) {
        throw Error::InvalidArgument(
            fmt::format("AutocastGuard: dtype {} is not a lower-precision type (bfloat16, float16)",
                        c10::toString(dtype)));
    }
    // A disabled scope keeps the dtype: it is not used, and 1.13 refuses some (fp16 on CPU).
    if (enabled) {
        try {
            compat::set_autocast_dtype(device_type, dtype);
        } catch (const c10::Error& e) {
            throw Error::InvalidArgument(fmt::format(
                "AutocastGuard: {} autocast refuses {}: {}", c10::DeviceTypeName(device_type),
                c10::toString(dtype), e.what_without_backtrace()));
        }
    }
    compat::set_autocast_enabled(device_type, enabled);
    at::autocast::increment_nesting();
}

AutocastGuard::AutocastGuard(const AutocastState& state) : previous_(AutocastState::capture()) {
    state.restore();
    at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    previous_.restore();
}

at::Tensor autocast_cast(const at::Tensor& t) {
    if (!t.defined() || !t.is_floating_point() || t.scalar_type() == at::kDouble) return t;
    const c10::DeviceType device = t.device().type();
    if ((device != c10::DeviceType::CPU && device != c10::DeviceType::CUDA) ||
        !compat::autocast_enabled(device)) {
        return t;
    }
    return t.to(compat::autocast_dtype(device));
}

int autocast_nesting() {
    // LibTorch has no getter: the counter is read through the increment's return value.
    const int level = at::autocast::increment_nesting();
    at::autocast::decrement_nesting();
    return level - 1;
}

CastCacheOff::CastCacheOff() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
}

CastCacheOff::~CastCacheOff() { at::autocast::set_autocast_cache_enabled(previous_); }

}  // namespace sf::model
