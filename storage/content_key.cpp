#include "storage/content_key.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "core/error.h"
#include "storage/atomic_file.h"
#include "storage/xxh3.h"

namespace sf::storage {
namespace {

// Length-prefixed, so ("ab", "c") and ("a", "bc") never hash alike.
void update_framed(XXH3Hasher& h, std::string_view bytes) {
    h.update_u64(bytes.size()).update(bytes);
}

}  // namespace

struct ContentKey::State {
    XXH3Hasher xxh;
};

ContentKey::ContentKey() : state_(new State{}) { update_framed(state_->xxh, kContentKeyScheme); }

ContentKey::~ContentKey() = default;
ContentKey::ContentKey(ContentKey&&) noexcept = default;
ContentKey& ContentKey::operator=(ContentKey&&) noexcept = default;

ContentKey& ContentKey::add_source(std::string_view bytes) {
    state_->xxh.update(bytes);
    source_size_ += bytes.size();
    return *this;
}

ContentKey& ContentKey::add_param(const std::string& name, std::string value) {
    if (!params_.emplace(name, std::move(value)).second) {
        throw Error::InvalidArgument("content key parameter '" + name + "' given twice");
    }
    return *this;
}

ContentKey& ContentKey::add_param(const std::string& name, int64_t value) {
    return add_param(name, std::to_string(value));
}

ContentKey& ContentKey::add_param(const std::string& name, double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", value);  // round-trips every double
    return add_param(name, std::string(text));
}

std::string ContentKey::hex() const {
    XXH3Hasher h = state_->xxh.copy();
    h.update_u64(source_size_).update_u64(params_.size());
    for (const auto& [name, value] : params_) {
        update_framed(h, name);
        update_framed(h, value);
    }
    return h.hex();
}

std::string content_key_of(std::string_view source,
                           const std::map<std::string, std::string>& params) {
    ContentKey key;
    key.add_source(source);
    for (const auto& [name, value] : params) key.add_param(name, value);
    return key.hex();
}

std::string content_key_of_file(const std::string& path,
                                const std::map<std::string, std::string>& params) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) {
        int err = errno;
        std::string text = "opening " + path + ": " + std::generic_category().message(err);
        throw err == ENOENT ? Error::NotFound(text) : Error::IOError(text);
    }
    ContentKey key;
    std::string buffer(size_t{1} << 20, '\0');
    while (true) {
        ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Error::IOError("reading " + path + ": " + std::generic_category().message(errno));
        }
        if (n == 0) break;
        key.add_source(std::string_view(buffer.data(), static_cast<size_t>(n)));
    }
    for (const auto& [name, value] : params) key.add_param(name, value);
    return key.hex();
}

}  // namespace sf::storage
