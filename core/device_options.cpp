#include "core/device_options.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "core/error.h"
#include "core/memory.h"

namespace sf {

c10::Device resolve_device(const std::string& flag) {
    if (flag == "auto") return mem::cuda_available() ? c10::Device("cuda:0") : c10::Device("cpu");
    if (flag == "cpu") return c10::Device("cpu");
    if (flag == "cuda" || flag.rfind("cuda:", 0) == 0) {
        if (!mem::cuda_available()) {
            throw Error::InvalidArgument("--device " + flag +
                                         ": this build or machine has no CUDA device");
        }
        try {
            return c10::Device(flag == "cuda" ? "cuda:0" : flag);
        } catch (const c10::Error&) {
            throw Error::InvalidArgument("--device must be auto, cpu, cuda or cuda:N, got '" +
                                         flag + "'");
        }
    }
    throw Error::InvalidArgument("--device must be auto, cpu, cuda or cuda:N, got '" + flag + "'");
}

c10::ScalarType resolve_dtype(const std::string& mixed_precision) {
    if (mixed_precision == "no" || mixed_precision == "fp32") return c10::kFloat;
    if (mixed_precision == "fp16") return c10::kHalf;
    if (mixed_precision == "bf16") return c10::kBFloat16;
    throw Error::InvalidArgument("--mixed_precision must be no, fp16 or bf16, got '" +
                                 mixed_precision + "'");
}

void require_compute_dtype(c10::Device device, c10::ScalarType dtype) {
    if (dtype == c10::kFloat) return;
    try {
        const at::Tensor x =
            at::ones({1, 2, 4, 4}, at::TensorOptions().dtype(dtype).device(device));
        at::conv2d(x, at::ones({2, 2, 3, 3}, x.options()));
        at::matmul(x, x);
    } catch (const c10::Error& e) {
        throw Error::InvalidArgument(
            fmt::format("--mixed_precision {}: this LibTorch has no {} convolution or matmul on {} "
                        "({}); use {} "
                        "there",
                        dtype_tag(dtype), c10::toString(dtype), device.str(),
                        e.what_without_backtrace(), dtype == c10::kHalf ? "bf16 or no" : "no"));
    }
}

std::string dtype_tag(c10::ScalarType dtype) {
    switch (dtype) {
        case c10::kFloat:
            return "fp32";
        case c10::kHalf:
            return "fp16";
        case c10::kBFloat16:
            return "bf16";
        default:
            return c10::toString(dtype);
    }
}

}  // namespace sf
