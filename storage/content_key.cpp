#include "storage/content_key.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "core/error.h"
#include "storage/atomic_file.h"

namespace sf::storage {
namespace {

struct StateDeleter {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using StatePtr = std::unique_ptr<XXH3_state_t, StateDeleter>;

StatePtr new_state() {
    StatePtr s(XXH3_createState());
    if (!s) throw Error::OutOfMemory("cannot allocate an XXH3 state");
    XXH3_128bits_reset(s.get());
    return s;
}

void update_u64(XXH3_state_t* s, uint64_t v) { XXH3_128bits_update(s, &v, sizeof(v)); }

// Length-prefixed, so ("ab", "c") and ("a", "bc") never hash alike.
void update_framed(XXH3_state_t* s, std::string_view bytes) {
    update_u64(s, bytes.size());
    XXH3_128bits_update(s, bytes.data(), bytes.size());
}

std::string hex_of(XXH128_hash_t hash) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, hash);
    static const char kHex[] = "0123456789abcdef";
    std::string out(32, '0');
    for (int i = 0; i < 16; ++i) {
        out[2 * i] = kHex[canonical.digest[i] >> 4];
        out[2 * i + 1] = kHex[canonical.digest[i] & 15];
    }
    return out;
}

}  // namespace

struct ContentKey::State {
    StatePtr xxh;
};

ContentKey::ContentKey() : state_(new State{new_state()}) {
    update_framed(state_->xxh.get(), kContentKeyScheme);
}

ContentKey::~ContentKey() = default;
ContentKey::ContentKey(ContentKey&&) noexcept = default;
ContentKey& ContentKey::operator=(ContentKey&&) noexcept = default;

ContentKey& ContentKey::add_source(std::string_view bytes) {
    XXH3_128bits_update(state_->xxh.get(), bytes.data(), bytes.size());
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
    StatePtr s(XXH3_createState());
    if (!s) throw Error::OutOfMemory("cannot allocate an XXH3 state");
    XXH3_copyState(s.get(), state_->xxh.get());
    update_u64(s.get(), source_size_);
    update_u64(s.get(), params_.size());
    for (const auto& [name, value] : params_) {
        update_framed(s.get(), name);
        update_framed(s.get(), value);
    }
    return hex_of(XXH3_128bits_digest(s.get()));
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

std::string xxh3_128_hex(std::string_view bytes) {
    return hex_of(XXH3_128bits(bytes.data(), bytes.size()));
}

}  // namespace sf::storage
