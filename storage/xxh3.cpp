#include "storage/xxh3.h"

#include <xxhash.h>

#include "core/error.h"

namespace sf::storage {
namespace {

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

struct StateDeleter {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

}  // namespace

struct XXH3Hasher::State {
    std::unique_ptr<XXH3_state_t, StateDeleter> xxh;
};

XXH3Hasher::XXH3Hasher() : state_(std::make_unique<State>()) {
    state_->xxh.reset(XXH3_createState());
    if (!state_->xxh) throw Error::OutOfMemory("cannot allocate an XXH3 state");
    XXH3_128bits_reset(state_->xxh.get());
}

XXH3Hasher::~XXH3Hasher() = default;
XXH3Hasher::XXH3Hasher(XXH3Hasher&&) noexcept = default;
XXH3Hasher& XXH3Hasher::operator=(XXH3Hasher&&) noexcept = default;

XXH3Hasher& XXH3Hasher::update(std::string_view bytes) {
    XXH3_128bits_update(state_->xxh.get(), bytes.data(), bytes.size());
    return *this;
}

XXH3Hasher& XXH3Hasher::update_u64(uint64_t v) {
    return update(std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)));
}

XXH3Hasher XXH3Hasher::copy() const {
    XXH3Hasher out;
    XXH3_copyState(out.state_->xxh.get(), state_->xxh.get());
    return out;
}

std::string XXH3Hasher::hex() const { return hex_of(XXH3_128bits_digest(state_->xxh.get())); }

std::string xxh3_128_hex(std::string_view bytes) {
    return hex_of(XXH3_128bits(bytes.data(), bytes.size()));
}

}  // namespace sf::storage
