#include "storage/tensor_record.h"

#include "core/error.h"
#include "storage/safetensors_format.h"

namespace sf::storage {
namespace {

struct DTypeEntry {
    DType dtype;
    const char* name;
    size_t size;
};

// The names are the safetensors format's and are part of the on-disk format: never change them.
constexpr DTypeEntry kDTypes[] = {
    {DType::kF32, "F32", 4},   {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},
    {DType::kI64, "I64", 8},   {DType::kI32, "I32", 4},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF64, "F64", 8},   {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
};

const DTypeEntry& entry_of(DType dtype) {
    for (const auto& e : kDTypes) {
        if (e.dtype == dtype) return e;
    }
    throw Error::InvalidArgument("unknown DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

const char* dtype_name(DType dtype) { return entry_of(dtype).name; }
size_t dtype_size(DType dtype) { return entry_of(dtype).size; }

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& e : kDTypes) {
        if (name == e.name) return e.dtype;
    }
    return std::nullopt;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
            throw Error::InvalidArgument("bad tensor shape: dimension " + std::to_string(d));
        }
    }
    return n;
}

TensorView view_of(const TensorData& tensor) {
    return TensorView{tensor.dtype, tensor.shape, tensor.bytes};
}

std::string encode_safetensors(const std::map<std::string, TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata) {
    SafetensorsPlan plan = plan_safetensors(tensors, metadata);
    std::string out;
    out.reserve(plan.header.size() + plan.data_size);
    out += plan.header;
    for (const auto& [name, view] : plan.order) out.append(view->bytes);
    return out;
}

std::string encode_safetensors(const Record& record) {
    std::map<std::string, TensorView> views;
    for (const auto& [name, tensor] : record.tensors) views.emplace(name, view_of(tensor));
    return encode_safetensors(views, record.metadata);
}

Record decode_safetensors(std::string_view buffer, const std::string& where) {
    SafetensorsLayout layout = parse_safetensors(buffer, where);
    Record record;
    for (auto& [name, info] : layout.tensors) {
        TensorData tensor;
        tensor.dtype = info.dtype;
        tensor.shape = std::move(info.shape);
        tensor.bytes =
            std::string(buffer.substr(layout.data_offset + info.begin, info.end - info.begin));
        if (tensor.dtype == DType::kBool) check_bool_bytes(tensor.bytes, where, name);
        record.tensors.emplace(name, std::move(tensor));
    }
    record.metadata = std::move(layout.metadata);
    return record;
}

}  // namespace sf::storage
