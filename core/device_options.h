// Where a model stage runs and in what precision, from the flags users already type:
// --device auto|cpu|cuda|cuda:N and --mixed_precision no|fp16|bf16.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace sf {

// "auto": the first CUDA device when there is one, else the CPU. kInvalidArgument naming
// --device for anything else, or for CUDA on a build or machine without it.
c10::Device resolve_device(const std::string& flag);

// "no" -> float32, "fp16" -> float16, "bf16" -> bfloat16; kInvalidArgument naming
// --mixed_precision otherwise.
c10::ScalarType resolve_dtype(const std::string& mixed_precision);

// kInvalidArgument naming --mixed_precision when `device` cannot compute convolutions and matmuls
// in `dtype` (LibTorch 1.13 has no float16 ones on the CPU), instead of a LibTorch error from
// the middle of a model.
void require_compute_dtype(c10::Device device, c10::ScalarType dtype);

// "fp32", "fp16", "bf16": how fingerprints and record metadata name a dtype.
std::string dtype_tag(c10::ScalarType dtype);

}  // namespace sf
