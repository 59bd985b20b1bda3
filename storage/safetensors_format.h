// The safetensors layout, shared by the in-memory codec (tensor_record.cpp) and the memory-mapped
// file reader and writer (safetensors_file.cpp). Layout, as the format defines it:
//   [8 bytes: header length N, little-endian u64][N bytes: JSON header][data]
//   header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value", ...}}
// Offsets are relative to the start of the data; the tensors tile the data exactly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "storage/tensor_record.h"

namespace sf::storage {

// Headers beyond this are refused rather than parsed (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;

struct TensorInfo {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets relative to the data section
    uint64_t end = 0;
};

struct SafetensorsLayout {
    uint64_t data_offset = 0;  // 8 + header length
    std::string_view header;   // the JSON text, inside the parsed buffer
    std::map<std::string, TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
};

// Bounds-checks `buffer` (the whole file or buffer) and returns its layout. Every violation is
// kCorruption naming `where`. Tensor bytes are not inspected here.
SafetensorsLayout parse_safetensors(std::string_view buffer, const std::string& where);

// Throws kCorruption when a bool tensor holds a byte other than 0 or 1.
void check_bool_bytes(std::string_view bytes, const std::string& where, const std::string& name);

// What a writer needs: the header bytes (length prefix included) and the tensors in data order.
struct SafetensorsPlan {
    std::string header;
    std::vector<std::pair<std::string, const TensorView*>> order;
    uint64_t data_size = 0;
};

// Tensors are laid out by descending item size, then name, so every tensor is aligned to its item
// size (the data section starts 8-aligned). Throws kInvalidArgument on a bad tensor or name.
SafetensorsPlan plan_safetensors(const std::map<std::string, TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata);

}  // namespace sf::storage
