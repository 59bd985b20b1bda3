#include "storage/safetensors_format.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "storage/json_text.h"

namespace sf::storage {
namespace {

using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors and the cache are little-endian; a big-endian host needs byte swaps");

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// Non-negative JSON integer that fits in int64, or nullopt (floats, negatives, huge values).
std::optional<int64_t> json_dim(const json& v) {
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
        int64_t i = v.get<int64_t>();
        if (i >= 0) return i;
    }
    return std::nullopt;
}

// Byte count of a tensor of `shape` and `dtype`, or nullopt on overflow.
std::optional<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, DType dtype) {
    uint64_t n = dtype_size(dtype);
    for (int64_t d : shape) {
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
    }
    if (n > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return n;
}

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                       const std::string& where) {
    auto fail = [&](const std::string& what) {
        return Error::Corruption(where + ": tensor '" + text_excerpt(name) + "' " + what);
    };
    if (!entry.is_object()) throw fail("is not a JSON object");
    TensorInfo info;

    auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) throw fail("has no dtype string");
    auto parsed = dtype_from_name(dtype->get_ref<const std::string&>());
    if (!parsed) throw fail("has unknown or unsupported dtype " + json_excerpt(*dtype));
    info.dtype = *parsed;

    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) throw fail("has no shape array");
    for (const json& d : *shape) {
        auto dim = json_dim(d);
        if (!dim)
            throw fail("has a shape entry that is not a non-negative integer: " + json_excerpt(d));
        info.shape.push_back(*dim);
    }

    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
        throw fail("has no data_offsets pair of non-negative integers");
    }
    info.begin = (*offsets)[0].get<uint64_t>();
    info.end = (*offsets)[1].get<uint64_t>();
    std::string range = "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.begin > info.end || info.end > data_size) {
        throw fail("has data_offsets " + range + " outside the " + std::to_string(data_size) +
                   "-byte data section");
    }
    auto nbytes = checked_nbytes(info.shape, info.dtype);
    if (!nbytes) throw fail("has a shape too large to address: " + shape_text(info.shape));
    if (info.end - info.begin != *nbytes) {
        throw fail("has data_offsets " + range + " holding " +
                   std::to_string(info.end - info.begin) + " bytes, but shape " +
                   shape_text(info.shape) + " of " + dtype_name(info.dtype) + " needs " +
                   std::to_string(*nbytes));
    }
    return info;
}

// The tensors must tile the data section exactly: no overlap (two tensors sharing bytes), no gap
// (bytes no tensor owns, which a flipped offset could otherwise hide in), nothing left over.
void check_tiling(const std::map<std::string, TensorInfo>& tensors, uint64_t data_size,
                  const std::string& where) {
    std::vector<std::pair<const std::string*, const TensorInfo*>> sorted;
    for (const auto& [name, info] : tensors) sorted.emplace_back(&name, &info);
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
    });
    uint64_t pos = 0;
    const std::string* previous = nullptr;
    for (const auto& [name, info] : sorted) {
        if (info->begin < pos) {
            throw Error::Corruption(where + ": tensor '" + text_excerpt(*name) +
                                    "' overlaps tensor '" + text_excerpt(*previous) + "'");
        }
        if (info->begin > pos) {
            throw Error::Corruption(where + ": bytes " + std::to_string(pos) + " to " +
                                    std::to_string(info->begin) +
                                    " of the data section belong to no tensor");
        }
        pos = info->end;
        previous = name;
    }
    if (pos != data_size) {
        throw Error::Corruption(where + ": the tensors end at byte " + std::to_string(pos) +
                                " but the data section has " + std::to_string(data_size));
    }
}

}  // namespace

SafetensorsLayout parse_safetensors(std::string_view buffer, const std::string& where) {
    if (buffer.size() < 8) {
        throw Error::Corruption(where + ": " + std::to_string(buffer.size()) +
                                " bytes, shorter than the 8-byte header length");
    }
    uint64_t header_size = 0;
    std::memcpy(&header_size, buffer.data(), 8);
    if (header_size > kMaxSafetensorsHeader) {
        throw Error::Corruption(where + ": header length " + std::to_string(header_size) +
                                " is over the limit of " + std::to_string(kMaxSafetensorsHeader));
    }
    if (header_size > buffer.size() - 8) {
        throw Error::Corruption(where + ": header length " + std::to_string(header_size) +
                                " runs past the end of the " + std::to_string(buffer.size()) +
                                " bytes");
    }
    SafetensorsLayout layout;
    layout.data_offset = 8 + header_size;
    layout.header = buffer.substr(8, header_size);
    if (layout.header.empty() || layout.header.front() != '{') {
        throw Error::Corruption(where + ": header does not start with '{'");
    }
    const json header = parse_json(layout.header, where + ": header", ErrorCode::kCorruption);
    if (!header.is_object()) throw Error::Corruption(where + ": header is not a JSON object");

    uint64_t data_size = buffer.size() - layout.data_offset;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object())
                throw Error::Corruption(where + ": __metadata__ is not an object");
            for (const auto& [key, value] : entry.items()) {
                if (!value.is_string()) {
                    throw Error::Corruption(where + ": __metadata__ value of '" +
                                            text_excerpt(key) + "' is not a string");
                }
                layout.metadata[key] = value.get<std::string>();
            }
            continue;
        }
        layout.tensors[name] = parse_entry(name, entry, data_size, where);
    }
    check_tiling(layout.tensors, data_size, where);
    return layout;
}

void check_bool_bytes(std::string_view bytes, const std::string& where, const std::string& name) {
    for (size_t i = 0; i < bytes.size(); ++i) {
        if (static_cast<unsigned char>(bytes[i]) > 1) {
            throw Error::Corruption(where + ": bool tensor '" + name + "' holds byte " +
                                    std::to_string(static_cast<unsigned char>(bytes[i])) +
                                    " at element " + std::to_string(i));
        }
    }
}

SafetensorsPlan plan_safetensors(const std::map<std::string, TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
    SafetensorsPlan plan;
    for (const auto& [name, view] : tensors) {
        if (name == "__metadata__") {
            throw Error::InvalidArgument("'__metadata__' is reserved and cannot name a tensor");
        }
        uint64_t want = static_cast<uint64_t>(shape_numel(view.shape)) * dtype_size(view.dtype);
        if (view.bytes.size() != want) {
            throw Error::InvalidArgument("tensor '" + name + "' has " +
                                         std::to_string(view.bytes.size()) + " bytes, but shape " +
                                         shape_text(view.shape) + " of " + dtype_name(view.dtype) +
                                         " needs " + std::to_string(want));
        }
        plan.order.emplace_back(name, &view);
    }
    // Names come sorted from the map; a stable sort by item size keeps them sorted within a size.
    std::stable_sort(plan.order.begin(), plan.order.end(), [](const auto& a, const auto& b) {
        return dtype_size(a.second->dtype) > dtype_size(b.second->dtype);
    });

    json header = json::object();
    for (const auto& [name, view] : plan.order) {
        uint64_t n = view->bytes.size();
        header[name] = {{"dtype", dtype_name(view->dtype)},
                        {"shape", view->shape},
                        {"data_offsets", {plan.data_size, plan.data_size + n}}};
        plan.data_size += n;
    }
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::string text;
    try {
        text = header.dump();
    } catch (const json::exception& e) {
        throw Error::InvalidArgument(std::string("a tensor name or metadata entry is not UTF-8: ") +
                                     e.what());
    }
    while ((8 + text.size()) % 8 != 0) text.push_back(' ');
    if (text.size() > kMaxSafetensorsHeader) {
        // The reader refuses such a header: never write what cannot be read back.
        throw Error::InvalidArgument("safetensors header of " + std::to_string(text.size()) +
                                     " bytes is over the limit of " +
                                     std::to_string(kMaxSafetensorsHeader));
    }
    uint64_t length = text.size();
    plan.header.resize(8);
    std::memcpy(plan.header.data(), &length, 8);
    plan.header += text;
    return plan;
}

}  // namespace sf::storage
