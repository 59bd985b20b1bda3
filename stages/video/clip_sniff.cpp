#include "stages/video/clip_sniff.h"

#include <cstring>

namespace sf::stages {
namespace {

bool starts_with(const uint8_t* data, size_t size, size_t at, const char* magic) {
    const size_t n = std::strlen(magic);
    return size >= at + n && std::memcmp(data + at, magic, n) == 0;
}

// ISO base media (MP4, MOV, M4V, 3GP) shares its `ftyp` box with still-image formats; the major
// brand tells them apart.
bool is_still_image_brand(const uint8_t* brand) {
    for (const char* b : {"heic", "heix", "heim", "heis", "mif1", "msf1", "avif", "avis", "jpeg"}) {
        if (std::memcmp(brand, b, 4) == 0) return true;
    }
    return false;
}

}  // namespace

std::string clip_container(const uint8_t* data, size_t size) {
    if (starts_with(data, size, 4, "ftyp") && size >= 12) {
        return is_still_image_brand(data + 8) ? "" : "mp4/mov";
    }
    // QuickTime files without ftyp start with a moov, mdat, free or wide atom.
    for (const char* atom : {"moov", "mdat", "wide", "free"}) {
        if (starts_with(data, size, 4, atom)) return "mp4/mov";
    }
    if (size >= 4 && data[0] == 0x1A && data[1] == 0x45 && data[2] == 0xDF && data[3] == 0xA3) {
        return "matroska/webm";  // an EBML header
    }
    if (starts_with(data, size, 0, "RIFF") && starts_with(data, size, 8, "AVI ")) return "avi";
    if (starts_with(data, size, 0, "FLV")) return "flv";
    if (starts_with(data, size, 0, "OggS")) return "ogg";
    // OpenCV reads no GIF: an animated (or still) GIF is decoded by libav, as a clip.
    if (starts_with(data, size, 0, "GIF87a") || starts_with(data, size, 0, "GIF89a")) return "gif";
    if (size >= 4 && data[0] == 0x00 && data[1] == 0x00 && data[2] == 0x01 && data[3] == 0xBA) {
        return "mpeg-ps";  // a pack header
    }
    // MPEG-TS: a sync byte every 188 bytes (two in a row at least).
    if (size >= 189 && data[0] == 0x47 && data[188] == 0x47) return "mpeg-ts";
    return "";
}

}  // namespace sf::stages
