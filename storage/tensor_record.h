// The torch-free record types and their byte forms.
//
// A Record is a set of named tensors plus string metadata. Its byte form is a standard
// safetensors buffer; in the cache each record is that buffer compressed as one zstd frame that
// carries its content size and content checksum, so every read is verified and any tool that
// speaks zstd and safetensors can read it (docs/cache-format.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sf::storage {

// Names on disk are the safetensors dtype strings; the enum values are never written.
enum class DType { kF32, kBF16, kF16, kI64, kI32, kU8, kBool, kF64, kI16, kI8 };

const char* dtype_name(DType dtype);  // "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view name);
size_t dtype_size(DType dtype);

// Elements in a tensor of `shape`: 1 for a 0-d tensor, 0 when any dimension is 0. Throws
// kInvalidArgument on a negative dimension or overflow.
int64_t shape_numel(const std::vector<int64_t>& shape);

// A tensor as bytes: row-major, little-endian, `bytes.size() == numel * dtype_size`.
struct TensorData {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::string bytes;

    bool operator==(const TensorData& o) const {
        return dtype == o.dtype && shape == o.shape && bytes == o.bytes;
    }
    bool operator!=(const TensorData& o) const { return !(*this == o); }
};

// A tensor whose bytes live elsewhere (a TensorData, an at::Tensor, a mapped file); used to write
// without copying. The bytes must outlive the view.
struct TensorView {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::string_view bytes;
};

TensorView view_of(const TensorData& tensor);

struct Record {
    std::map<std::string, TensorData> tensors;
    std::map<std::string, std::string> metadata;

    bool operator==(const Record& o) const {
        return tensors == o.tensors && metadata == o.metadata;
    }
    bool operator!=(const Record& o) const { return !(*this == o); }
};

// Standard safetensors bytes: 8-byte little-endian header length, JSON header (with
// "__metadata__" when `metadata` is not empty) padded with spaces to a multiple of 8, then the
// tensors' bytes. Throws kInvalidArgument when a tensor's byte count does not match its shape or a
// name is not valid UTF-8.
std::string encode_safetensors(const Record& record);
std::string encode_safetensors(const std::map<std::string, TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Parses and bounds-checks a safetensors buffer and copies its tensors out. Every violation
// (header length, JSON, dtype names, offsets outside the buffer, offsets that disagree with
// shape * itemsize, gaps or overlaps, bool bytes other than 0/1) throws kCorruption naming
// `where` and what is wrong.
Record decode_safetensors(std::string_view buffer, const std::string& where = "safetensors buffer");

// --- The cache's record form (record_codec.cpp) -------------------------------------------------

constexpr int kDefaultZstdLevel = 3;
// The most bytes a record frame may declare unless its reader says less (the cache's readers use
// schema::max_record_bytes of the record's database): a damaged or hostile frame header must not
// turn into a huge allocation.
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 30;

// encode_safetensors(record) as one zstd frame with content size and content checksum.
std::string encode_record(const Record& record, int zstd_level = kDefaultZstdLevel);

// Verifies the frame (it must declare its content size, at most `max_bytes`, and a checksum, the
// checksum must match, no bytes may follow it) and decodes the safetensors inside. Memory grows
// with the bytes the frame really produces, never with what its header claims. Any failure is
// kCorruption naming `key_for_errors`.
Record decode_record(std::string_view frame, const std::string& key_for_errors,
                     uint64_t max_bytes = kMaxRecordBytes);

// The verified safetensors bytes of a record frame, without parsing them.
std::string decompress_record(std::string_view frame, const std::string& key_for_errors,
                              uint64_t max_bytes = kMaxRecordBytes);

// The uncompressed size a record frame declares, read from its header alone (no decompression,
// so not verified). kCorruption when the bytes do not start a record frame or declare more than
// `max_bytes`.
uint64_t record_content_size(std::string_view frame, const std::string& key_for_errors,
                             uint64_t max_bytes = kMaxRecordBytes);

}  // namespace sf::storage
