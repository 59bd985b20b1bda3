#include "storage/tensor_convert.h"

#include <ATen/ATen.h>

#include <cstring>

#include "core/error.h"
#include "storage/safetensors_file.h"

namespace sf::storage {
namespace {

DType dtype_of(const at::Tensor& tensor) {
    switch (tensor.scalar_type()) {
        case at::kFloat:
            return DType::kF32;
        case at::kBFloat16:
            return DType::kBF16;
        case at::kHalf:
            return DType::kF16;
        case at::kLong:
            return DType::kI64;
        case at::kInt:
            return DType::kI32;
        case at::kByte:
            return DType::kU8;
        case at::kBool:
            return DType::kBool;
        case at::kDouble:
            return DType::kF64;
        case at::kShort:
            return DType::kI16;
        case at::kChar:
            return DType::kI8;
        default:
            throw Error::InvalidArgument(std::string("tensor dtype ") +
                                         c10::toString(tensor.scalar_type()) +
                                         " has no safetensors record form");
    }
}

at::ScalarType scalar_type_of(DType dtype) {
    switch (dtype) {
        case DType::kF32:
            return at::kFloat;
        case DType::kBF16:
            return at::kBFloat16;
        case DType::kF16:
            return at::kHalf;
        case DType::kI64:
            return at::kLong;
        case DType::kI32:
            return at::kInt;
        case DType::kU8:
            return at::kByte;
        case DType::kBool:
            return at::kBool;
        case DType::kF64:
            return at::kDouble;
        case DType::kI16:
            return at::kShort;
        case DType::kI8:
            return at::kChar;
    }
    throw Error::InvalidArgument("unknown DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

TensorData to_tensor_data(const at::Tensor& tensor) {
    at::Tensor cpu =
        tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(at::kCPU).contiguous();
    TensorData out;
    out.dtype = dtype_of(cpu);
    out.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
    size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
    out.bytes.assign(static_cast<const char*>(cpu.data_ptr()), nbytes);
    return out;
}

at::Tensor from_tensor_data(const TensorData& data) {
    int64_t numel = shape_numel(data.shape);
    size_t want = static_cast<size_t>(numel) * dtype_size(data.dtype);
    if (data.bytes.size() != want) {
        throw Error::InvalidArgument("tensor data has " + std::to_string(data.bytes.size()) +
                                     " bytes, its shape needs " + std::to_string(want));
    }
    at::Tensor out = at::empty(data.shape, at::TensorOptions().dtype(scalar_type_of(data.dtype)));
    if (want > 0) std::memcpy(out.data_ptr(), data.bytes.data(), want);
    return out;
}

at::Tensor wrap_view(const TensorView& view) {
    const size_t want = static_cast<size_t>(shape_numel(view.shape)) * dtype_size(view.dtype);
    if (view.bytes.size() != want) {
        throw Error::InvalidArgument("tensor view has " + std::to_string(view.bytes.size()) +
                                     " bytes, its shape needs " + std::to_string(want));
    }
    // from_blob never writes through the pointer unless the caller does.
    void* data = const_cast<char*>(view.bytes.data());
    return at::from_blob(data, view.shape, at::TensorOptions().dtype(scalar_type_of(view.dtype)));
}

TensorView view_of(const at::Tensor& tensor) {
    if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
        throw Error::InvalidArgument("view_of needs a contiguous CPU tensor");
    }
    TensorView view;
    view.dtype = dtype_of(tensor);
    view.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    size_t nbytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
    view.bytes = std::string_view(static_cast<const char*>(tensor.data_ptr()), nbytes);
    return view;
}

void write_tensors_file(const std::string& path,
                        const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
    std::vector<at::Tensor> keep;  // the CPU copies must outlive the views
    keep.reserve(tensors.size());
    std::map<std::string, TensorView> views;
    for (const auto& [name, t] : tensors) {
        keep.push_back(t.detach().to(at::kCPU).contiguous());
        views[name] = view_of(keep.back());
    }
    write_safetensors_file(path, views, metadata);
}

}  // namespace sf::storage
