// Content keys: a record's key is a hash of what it was made from (the source bytes, and for
// video the window) plus every parameter of the transform, so an edited image gets a new key, a
// renamed or moved file keeps its key, and the order of the dataset never matters.
//
// The hash is XXH3-128 over a framed stream: a scheme tag, the source bytes, their length, then
// each parameter as length-prefixed name and value in name order. Changing any of that changes
// every key, so it is frozen; bump kContentKeyScheme instead.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace sf::storage {

constexpr std::string_view kContentKeyScheme = "sanaflow-content-key-v1";

class ContentKey {
public:
    ContentKey();
    ~ContentKey();
    ContentKey(ContentKey&&) noexcept;
    ContentKey& operator=(ContentKey&&) noexcept;

    // Source bytes; may be called many times to stream a large source.
    ContentKey& add_source(std::string_view bytes);
    // One transform parameter. Order of calls does not matter; a name given twice is
    // kInvalidArgument.
    ContentKey& add_param(const std::string& name, std::string value);
    ContentKey& add_param(const std::string& name, int64_t value);
    ContentKey& add_param(const std::string& name, double value);
    ContentKey& add_param(const std::string& name, const char* value) {
        return add_param(name, std::string(value));
    }

    // 32 lowercase hex characters. The builder stays usable.
    std::string hex() const;

private:
    struct State;
    std::unique_ptr<State> state_;
    uint64_t source_size_ = 0;
    std::map<std::string, std::string> params_;
};

// Key of a file's bytes (streamed, not loaded whole) with transform parameters. kNotFound or
// kIOError name the path.
std::string content_key_of_file(const std::string& path,
                                const std::map<std::string, std::string>& params);

// Key of an in-memory source (a caption, an encoded image) with transform parameters.
std::string content_key_of(std::string_view source,
                           const std::map<std::string, std::string>& params);

}  // namespace sf::storage
