#include "core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sf {

std::string shape_string(c10::IntArrayRef shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string shape_string(const at::Tensor& t) {
    return t.defined() ? shape_string(t.sizes()) : "(none)";
}

}  // namespace sf
