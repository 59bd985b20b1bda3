// Safetensors files for model weights and checkpoints: memory-mapped reading with a bounds-checked
// header, sharded checkpoints (`*.safetensors.index.json`), and atomic writing.
//
// Files written here carry a checksum in "__metadata__" (kSafetensorsChecksumKey: XXH3-128 of the
// whole file with the checksum's own 32 hex digits read as '0'), which other tools ignore and
// which makes any flipped byte a kCorruption error on open. Files from elsewhere have none: their
// header is still bounds-checked, but a damaged tensor byte cannot be detected.
//
// The mapping is read-only and shared: a file truncated by another program while it is open
// makes reads past the new end fault (SIGBUS), as with any mapped file.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "storage/safetensors_format.h"
#include "storage/tensor_record.h"

namespace sf::storage {

constexpr const char* kSafetensorsChecksumKey = "sanaflow.xxh3_128";

enum class ChecksumPolicy {
    kVerifyIfPresent,  // verify files that carry a checksum (default)
    kRequire,          // a file without one is kCorruption: for files sanaflow wrote itself
    kSkip,             // header checks only: for a quick listing of a large file
};

class SafetensorsFile {
public:
    // kNotFound or kIOError for the file itself, kCorruption for its contents.
    static SafetensorsFile open(const std::string& path,
                                ChecksumPolicy policy = ChecksumPolicy::kVerifyIfPresent);
    ~SafetensorsFile();
    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

    const std::string& path() const { return path_; }
    std::vector<std::string> names() const;
    bool contains(const std::string& name) const { return layout_.tensors.count(name) > 0; }
    // kNotFound naming the file when there is no such tensor.
    const TensorInfo& info(const std::string& name) const;
    // The tensor's bytes inside the mapping; valid while this object lives.
    std::string_view view(const std::string& name) const;
    // A copy, with bool bytes checked.
    TensorData read(const std::string& name) const;
    // __metadata__, the checksum entry included.
    const std::map<std::string, std::string>& metadata() const { return layout_.metadata; }
    bool has_checksum() const { return layout_.metadata.count(kSafetensorsChecksumKey) > 0; }
    size_t file_size() const;

private:
    struct Mapping;
    SafetensorsFile() = default;

    std::string path_;
    std::unique_ptr<Mapping> mapping_;
    SafetensorsLayout layout_;
};

// A checkpoint in one file or in shards. `path` is a .safetensors file, a
// .safetensors.index.json, or a directory holding one index (preferred) or one .safetensors file.
class SafetensorsCheckpoint {
public:
    static SafetensorsCheckpoint open(const std::string& path,
                                      ChecksumPolicy policy = ChecksumPolicy::kVerifyIfPresent);

    std::vector<std::string> names() const;
    bool contains(const std::string& name) const { return shard_of_.count(name) > 0; }
    const TensorInfo& info(const std::string& name) const;
    std::string_view view(const std::string& name) const;
    TensorData read(const std::string& name) const;
    const SafetensorsFile& file_of(const std::string& name) const;
    // The index's "metadata" (non-string values as JSON text), or the single file's metadata.
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    size_t shard_count() const { return shards_.size(); }

private:
    std::string path_;
    std::vector<SafetensorsFile> shards_;
    std::map<std::string, size_t> shard_of_;
    std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file atomically (temporary file, fsync, rename, directory fsync), with the
// checksum entry unless `with_checksum` is false. Tensors are streamed, not copied into a buffer.
void write_safetensors_file(const std::string& path, const Record& record,
                            bool with_checksum = true);
void write_safetensors_file(const std::string& path,
                            const std::map<std::string, TensorView>& tensors,
                            const std::map<std::string, std::string>& metadata,
                            bool with_checksum = true);

// Writes `<dir>/<base>-0000i-of-0000n.safetensors` shards of at most `max_shard_bytes` of tensor
// data each (a larger tensor gets a shard of its own), then `<dir>/<base>.safetensors.index.json`
// last, so a checkpoint whose index exists is complete. Returns the index path.
std::string write_sharded_safetensors(const std::string& dir, const std::string& base,
                                      const std::map<std::string, TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      uint64_t max_shard_bytes);

}  // namespace sf::storage
