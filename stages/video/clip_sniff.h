// Whether a file is a video clip, from its first bytes (the container's magic), so that prep
// sorts a folder of images and clips by content, not by extension: a clip named .jpg is a clip,
// and an AVIF or HEIF image (an ISO base media file like MP4) is not. Torch-free and libav-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sf::stages {

// Bytes of a file's start that looks_like_clip() needs.
constexpr size_t kClipSniffBytes = 256;

// The container's name ("mp4/mov", "matroska/webm", "avi", "mpeg-ts", "flv", "ogg", "mpeg-ps",
// "gif") when the bytes start like one, else empty.
std::string clip_container(const uint8_t* data, size_t size);
inline bool looks_like_clip(const uint8_t* data, size_t size) {
    return !clip_container(data, size).empty();
}

}  // namespace sf::stages
