#include "core/device_options.h"

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
        return c10::Device(flag == "cuda" ? "cuda:0" : flag);
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
