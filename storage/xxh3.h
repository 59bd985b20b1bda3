// XXH3-128, the one hash of the cache: content keys, fingerprints and file checksums, always
// written as the 16 bytes of the canonical (big-endian) digest in lowercase hex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace sf::storage {

// A streaming XXH3-128 (seed 0).
class XXH3Hasher {
public:
    XXH3Hasher();
    ~XXH3Hasher();
    XXH3Hasher(XXH3Hasher&&) noexcept;
    XXH3Hasher& operator=(XXH3Hasher&&) noexcept;

    XXH3Hasher& update(std::string_view bytes);
    XXH3Hasher& update_u64(uint64_t v);  // little-endian, as the content-key scheme frames lengths
    // A hasher that continues from this one's state.
    XXH3Hasher copy() const;
    // 32 lowercase hex characters of the digest so far; the hasher stays usable.
    std::string hex() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

// XXH3-128 of `bytes` as 32 hex characters: a plain checksum, not a content key.
std::string xxh3_128_hex(std::string_view bytes);

}  // namespace sf::storage
