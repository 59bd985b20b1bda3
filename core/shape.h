// How messages and logs print a tensor's shape: "[2, 3, 64, 64]".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace sf {

std::string shape_string(c10::IntArrayRef shape);
// The tensor's shape, or "(none)" for an undefined tensor.
std::string shape_string(const at::Tensor& t);

}  // namespace sf
