#include "storage/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "storage/atomic_file.h"
#include "storage/xxh3.h"

namespace sf::storage {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kZeroDigest(32, '0');

bool is_hex_digest(const std::string& s) {
    if (s.size() != 32) return false;
    for (char c : s) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

// Where the checksum's digits sit in `header_bytes`, or npos. The JSON is written compact, so the
// field appears exactly as `"key":"digits"`; quotes inside names and values are escaped, so this
// text cannot occur anywhere else.
size_t find_digest(std::string_view header_bytes, const std::string& digest) {
    std::string needle = std::string("\"") + kSafetensorsChecksumKey + "\":\"" + digest + "\"";
    size_t pos = header_bytes.find(needle);
    if (pos == std::string_view::npos ||
        header_bytes.find(needle, pos + 1) != std::string_view::npos) {
        return std::string_view::npos;
    }
    return pos + needle.size() - 1 - digest.size();
}

void verify_checksum(std::string_view file, const SafetensorsLayout& layout,
                     const std::string& path) {
    const std::string& digest = layout.metadata.at(kSafetensorsChecksumKey);
    if (!is_hex_digest(digest)) {
        throw Error::Corruption(path + ": checksum entry '" + digest + "' is not 32 hex digits");
    }
    size_t at = find_digest(layout.header, digest);
    if (at == std::string_view::npos) {
        throw Error::Corruption(path + ": cannot locate the checksum entry in the header");
    }
    size_t digits = 8 + at;  // offset in the file
    XXH3Hasher hasher;
    hasher.update(file.substr(0, digits));
    hasher.update(kZeroDigest);
    hasher.update(file.substr(digits + 32));
    std::string actual = hasher.hex();
    if (actual != digest) {
        throw Error::Corruption(path + ": checksum mismatch: the header says " + digest +
                                ", the contents hash to " + actual);
    }
}

}  // namespace

struct SafetensorsFile::Mapping {
    void* addr = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (addr != nullptr) ::munmap(addr, size);
    }
    std::string_view bytes() const { return {static_cast<const char*>(addr), size}; }
};

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

SafetensorsFile SafetensorsFile::open(const std::string& path, ChecksumPolicy policy) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
        int err = errno;
        std::string text = "opening safetensors file " + path + ": " + std::strerror(err);
        throw err == ENOENT ? Error::NotFound(text) : Error::IOError(text);
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0)
        throw Error::IOError("stat of " + path + ": " + std::strerror(errno));
    SafetensorsFile file;
    file.path_ = path;
    file.mapping_ = std::make_unique<Mapping>();
    file.mapping_->size = static_cast<size_t>(st.st_size);
    if (file.mapping_->size < 8) {
        throw Error::Corruption(path + ": " + std::to_string(file.mapping_->size) +
                                " bytes, shorter than the 8-byte header length");
    }
    void* addr = ::mmap(nullptr, file.mapping_->size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (addr == MAP_FAILED) throw Error::IOError("mapping " + path + ": " + std::strerror(errno));
    file.mapping_->addr = addr;

    std::string_view bytes = file.mapping_->bytes();
    file.layout_ = parse_safetensors(bytes, path);
    bool present = file.has_checksum();
    if (policy == ChecksumPolicy::kRequire && !present) {
        throw Error::Corruption(path + ": no " + kSafetensorsChecksumKey +
                                " entry in __metadata__, and this file must carry one");
    }
    if (present && policy != ChecksumPolicy::kSkip) verify_checksum(bytes, file.layout_, path);
    return file;
}

std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> out;
    for (const auto& [name, info] : layout_.tensors) out.push_back(name);
    return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
    auto it = layout_.tensors.find(name);
    if (it == layout_.tensors.end()) throw Error::NotFound(path_ + " has no tensor '" + name + "'");
    return it->second;
}

std::string_view SafetensorsFile::view(const std::string& name) const {
    const TensorInfo& i = info(name);
    return mapping_->bytes().substr(layout_.data_offset + i.begin, i.end - i.begin);
}

TensorData SafetensorsFile::read(const std::string& name) const {
    const TensorInfo& i = info(name);
    TensorData out{i.dtype, i.shape, std::string(view(name))};
    if (out.dtype == DType::kBool) check_bool_bytes(out.bytes, path_, name);
    return out;
}

size_t SafetensorsFile::file_size() const { return mapping_->size; }

void write_safetensors_file(const std::string& path,
                            const std::map<std::string, TensorView>& tensors,
                            const std::map<std::string, std::string>& metadata,
                            bool with_checksum) {
    std::map<std::string, std::string> meta = metadata;
    if (with_checksum) {
        meta[kSafetensorsChecksumKey] = kZeroDigest;
    } else {
        meta.erase(kSafetensorsChecksumKey);
    }
    SafetensorsPlan plan = plan_safetensors(tensors, meta);
    if (with_checksum) {
        XXH3Hasher hasher;
        hasher.update(plan.header);
        for (const auto& [name, view] : plan.order) hasher.update(view->bytes);
        size_t at = find_digest(std::string_view(plan.header).substr(8), kZeroDigest);
        if (at == std::string_view::npos) {
            throw Error::InvalidArgument(path + ": cannot place the checksum in the header");
        }
        plan.header.replace(8 + at, 32, hasher.hex());
    }
    AtomicFileWriter writer(path);
    writer.write(plan.header);
    for (const auto& [name, view] : plan.order) writer.write(view->bytes);
    writer.commit();
}

void write_safetensors_file(const std::string& path, const Record& record, bool with_checksum) {
    std::map<std::string, TensorView> views;
    for (const auto& [name, tensor] : record.tensors) views.emplace(name, view_of(tensor));
    write_safetensors_file(path, views, record.metadata, with_checksum);
}

std::string write_sharded_safetensors(const std::string& dir, const std::string& base,
                                      const std::map<std::string, TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      uint64_t max_shard_bytes) {
    std::vector<std::map<std::string, TensorView>> shards(1);
    uint64_t shard_bytes = 0;
    uint64_t total = 0;
    for (const auto& [name, view] : tensors) {
        if (!shards.back().empty() && shard_bytes + view.bytes.size() > max_shard_bytes) {
            shards.emplace_back();
            shard_bytes = 0;
        }
        shards.back().emplace(name, view);
        shard_bytes += view.bytes.size();
        total += view.bytes.size();
    }
    json weight_map = json::object();
    char suffix[64];
    for (size_t i = 0; i < shards.size(); ++i) {
        std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu.safetensors", i + 1, shards.size());
        std::string file = base + suffix;
        write_safetensors_file((fs::path(dir) / file).string(), shards[i], metadata);
        for (const auto& [name, view] : shards[i]) weight_map[name] = file;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    for (const auto& [key, value] : metadata) index["metadata"][key] = value;
    std::string index_path = (fs::path(dir) / (base + ".safetensors.index.json")).string();
    write_file_atomic(index_path, index.dump(2) + "\n");
    return index_path;
}

}  // namespace sf::storage
