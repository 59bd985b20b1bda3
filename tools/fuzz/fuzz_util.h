// Shared by the fuzz targets: each feeds its input to one reader and accepts only an sf::Error
// (the reader refusing the input); any other exception, a crash, a leak or undefined behaviour
// (ASan, UBSan) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace sf::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// A scratch directory of this process, made once: for readers that take a path. In memory
// (/dev/shm) where there is one: a file is written for every input.
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        std::string pattern = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm/sanaflow_fuzz_XXXXXX"
                                                              : "/tmp/sanaflow_fuzz_XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) std::abort();
        return pattern;
    }();
    return dir;
}

// `bytes` written to <scratch>/<name>, replacing what was there (plainly: no fsync per input).
inline std::string scratch_file(const std::string& name, std::string_view bytes) {
    const std::string path = scratch_dir() + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();
    return path;
}

template <typename F>
void refused_or_read(F&& read) {
    try {
        read();
    } catch (const Error&) {
    }
}

}  // namespace sf::fuzz
