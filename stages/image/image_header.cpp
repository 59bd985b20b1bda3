#include "stages/image/image_header.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

namespace sf::stages {
namespace {

// Bounds-checked view of the input. Every multi-byte read goes through load(), which fails
// instead of reading past the end; offsets are size_t and compared by subtraction so that an
// offset read from the file cannot overflow the check.
class Bytes {
public:
    Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    size_t size() const { return size_; }
    const uint8_t* at(size_t offset) const { return data_ + offset; }
    uint8_t operator[](size_t offset) const { return data_[offset]; }
    bool has(size_t offset, uint64_t length) const {
        return offset <= size_ && size_ - offset >= length;
    }
    bool equals(size_t offset, const char* text, size_t length) const {
        return has(offset, length) && std::memcmp(data_ + offset, text, length) == 0;
    }
    bool load(size_t offset, int bytes, bool big_endian, uint64_t* out) const {
        if (!has(offset, static_cast<uint64_t>(bytes))) return false;
        uint64_t value = 0;
        for (int i = 0; i < bytes; ++i) {
            const int index = big_endian ? i : bytes - 1 - i;
            value = (value << 8) | data_[offset + index];
        }
        *out = value;
        return true;
    }

private:
    const uint8_t* data_;
    size_t size_;
};

int64_t clamp_to_int64(uint64_t v) {
    const auto max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    return static_cast<int64_t>(v > max ? max : v);
}

// ---- JPEG ----------------------------------------------------------------------------------

bool is_start_of_frame(uint8_t marker) {
    // SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC), which share the range.
    return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

// Skips entropy-coded data after a SOS segment; returns the offset of the next real marker, or
// size when the data ends first. Inside a scan FF 00 is a stuffed byte and FF D0..D7 a restart.
size_t skip_entropy_data(const Bytes& b, size_t pos) {
    while (pos < b.size()) {
        const void* ff = std::memchr(b.at(pos), 0xFF, b.size() - pos);
        if (ff == nullptr) return b.size();
        pos = static_cast<size_t>(static_cast<const uint8_t*>(ff) - b.at(0));
        if (pos + 1 >= b.size()) return b.size();
        const uint8_t next = b[pos + 1];
        if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
            pos += 2;
        } else if (next == 0xFF) {
            pos += 1;  // fill byte before a marker
        } else {
            return pos;
        }
    }
    return b.size();
}

ImageHeader read_jpeg(const Bytes& b) {
    ImageHeader h;
    h.format = ImageFormat::kJPEG;
    bool have_frame = false;
    bool have_exif = false;
    bool ended = false;
    size_t pos = 2;  // after SOI
    while (pos < b.size()) {
        if (b[pos] != 0xFF) {
            // libjpeg skips stray bytes between segments with a warning; so do we.
            const void* ff = std::memchr(b.at(pos), 0xFF, b.size() - pos);
            if (ff == nullptr) break;
            pos = static_cast<size_t>(static_cast<const uint8_t*>(ff) - b.at(0));
        }
        while (pos < b.size() && b[pos] == 0xFF) ++pos;
        if (pos >= b.size()) break;
        const uint8_t marker = b[pos++];
        if (marker == 0xD9) {
            ended = true;
            break;
        }
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length field
        uint64_t length = 0;
        if (!b.load(pos, 2, true, &length)) break;
        if (length < 2) {
            (have_frame ? h.truncated : h.error) = "JPEG: bad segment length";
            break;
        }
        if (!b.has(pos, length)) break;
        const uint8_t* segment = b.at(pos + 2);
        const size_t segment_length = length - 2;
        if (is_start_of_frame(marker) && !have_frame) {
            if (segment_length < 6) {
                h.error = "JPEG: frame header too short";
                return h;
            }
            h.height = (segment[1] << 8) | segment[2];
            h.width = (segment[3] << 8) | segment[4];
            have_frame = true;
        } else if (marker == 0xE1 && !have_exif && segment_length >= 6 &&
                   std::memcmp(segment, "Exif\0\0", 6) == 0) {
            h.orientation = exif_orientation(segment, segment_length);
            have_exif = true;
        }
        pos += length;
        if (marker == 0xDA) {
            if (!have_frame) {
                h.error = "JPEG: scan before the frame header";
                return h;
            }
            pos = skip_entropy_data(b, pos);
        }
    }
    if (!have_frame) {
        if (h.error.empty()) h.error = "JPEG: data ends before the frame header";
        return h;
    }
    if (!ended && h.truncated.empty()) h.truncated = "JPEG: no end-of-image marker";
    return h;
}

// ---- PNG -----------------------------------------------------------------------------------

ImageHeader read_png(const Bytes& b) {
    ImageHeader h;
    h.format = ImageFormat::kPNG;
    uint64_t width = 0;
    uint64_t height = 0;
    if (!b.equals(12, "IHDR", 4) || !b.has(8, 8 + 13 + 4)) {
        h.error = b.has(8, 8 + 13) ? "PNG: first chunk is not IHDR" : "PNG: data ends in IHDR";
        return h;
    }
    b.load(16, 4, true, &width);
    b.load(20, 4, true, &height);
    h.width = static_cast<int64_t>(width);
    h.height = static_cast<int64_t>(height);
    bool ended = false;
    size_t pos = 8;
    while (b.has(pos, 12)) {
        uint64_t length = 0;
        b.load(pos, 4, true, &length);
        if (length > 0x7FFFFFFFu) {
            h.truncated = "PNG: bad chunk length";
            return h;
        }
        if (b.equals(pos + 4, "IEND", 4)) {
            ended = true;
            break;
        }
        if (!b.has(pos + 8, length + 4)) break;
        if (b.equals(pos + 4, "eXIf", 4)) h.orientation = exif_orientation(b.at(pos + 8), length);
        pos += 12 + length;
    }
    if (!ended) h.truncated = "PNG: no IEND chunk";
    return h;
}

// ---- WebP ----------------------------------------------------------------------------------

ImageHeader read_webp(const Bytes& b) {
    ImageHeader h;
    h.format = ImageFormat::kWebP;
    uint64_t riff_size = 0;
    b.load(4, 4, false, &riff_size);
    const uint64_t riff_end = riff_size + 8;
    bool have_size = false;
    size_t pos = 12;
    while (pos < riff_end && b.has(pos, 8)) {
        uint64_t chunk_size = 0;
        b.load(pos + 4, 4, false, &chunk_size);
        const size_t payload = pos + 8;
        const bool complete = b.has(payload, chunk_size);
        uint64_t v = 0;
        if (b.equals(pos, "VP8X", 4) && b.has(payload, 10)) {
            // The canvas size: what the decoder allocates, for still and animated files alike.
            b.load(payload + 4, 3, false, &v);
            h.width = static_cast<int64_t>(v) + 1;
            b.load(payload + 7, 3, false, &v);
            h.height = static_cast<int64_t>(v) + 1;
            have_size = true;
        } else if (b.equals(pos, "VP8 ", 4) && !have_size && b.has(payload, 10)) {
            if (b[payload + 3] != 0x9D || b[payload + 4] != 0x01 || b[payload + 5] != 0x2A) {
                h.error = "WebP: bad VP8 start code";
                return h;
            }
            b.load(payload + 6, 2, false, &v);
            h.width = static_cast<int64_t>(v & 0x3FFF);
            b.load(payload + 8, 2, false, &v);
            h.height = static_cast<int64_t>(v & 0x3FFF);
            have_size = true;
        } else if (b.equals(pos, "VP8L", 4) && !have_size && b.has(payload, 5)) {
            if (b[payload] != 0x2F) {
                h.error = "WebP: bad VP8L signature";
                return h;
            }
            b.load(payload + 1, 4, false, &v);
            h.width = static_cast<int64_t>(v & 0x3FFF) + 1;
            h.height = static_cast<int64_t>((v >> 14) & 0x3FFF) + 1;
            have_size = true;
        } else if (b.equals(pos, "EXIF", 4) && complete) {
            h.orientation = exif_orientation(b.at(payload), chunk_size);
        }
        if (!complete) break;
        pos = payload + chunk_size + (chunk_size & 1);  // chunks are padded to even sizes
    }
    if (!have_size) {
        h.error = "WebP: no VP8, VP8L or VP8X chunk";
        return h;
    }
    if (!b.has(0, riff_end)) h.truncated = "WebP: data shorter than the RIFF size";
    return h;
}

// ---- BMP -----------------------------------------------------------------------------------

ImageHeader read_bmp(const Bytes& b) {
    ImageHeader h;
    h.format = ImageFormat::kBMP;
    uint64_t file_size = 0, pixel_offset = 0, dib_size = 0, v = 0;
    if (!b.load(2, 4, false, &file_size) || !b.load(10, 4, false, &pixel_offset) ||
        !b.load(14, 4, false, &dib_size)) {
        h.error = "BMP: data ends in the file header";
        return h;
    }
    int64_t width = 0, height = 0;
    uint64_t bits = 0, compression = 0;
    if (dib_size == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
        if (!b.has(0, 26)) {
            h.error = "BMP: data ends in the info header";
            return h;
        }
        b.load(18, 2, false, &v);
        width = static_cast<int64_t>(v);
        b.load(20, 2, false, &v);
        height = static_cast<int64_t>(v);
        b.load(24, 2, false, &bits);
    } else if (dib_size >= 16 && dib_size <= 1024) {
        if (!b.has(0, dib_size >= 20 ? 34 : 30)) {
            h.error = "BMP: data ends in the info header";
            return h;
        }
        b.load(18, 4, false, &v);
        width = static_cast<int32_t>(static_cast<uint32_t>(v));
        b.load(22, 4, false, &v);
        height = static_cast<int32_t>(static_cast<uint32_t>(v));  // negative: rows top-down
        b.load(28, 2, false, &bits);
        if (dib_size >= 20) b.load(30, 4, false, &compression);
    } else {
        h.error = "BMP: unknown info header size " + std::to_string(dib_size);
        return h;
    }
    if (width <= 0 || height == 0) {
        h.error = "BMP: bad size " + std::to_string(width) + "x" + std::to_string(height);
        return h;
    }
    h.width = width;
    h.height = std::llabs(height);
    const bool uncompressed = compression == 0 || compression == 3 || compression == 6;
    if (uncompressed && bits >= 1 && bits <= 32) {
        const uint64_t stride = (static_cast<uint64_t>(h.width) * bits + 31) / 32 * 4;
        if (!b.has(0, pixel_offset) ||
            static_cast<uint64_t>(h.height) > (b.size() - pixel_offset) / stride) {
            h.truncated = "BMP: pixel data runs past the end of the data";
        }
    } else if (file_size > b.size()) {
        h.truncated = "BMP: data shorter than the declared file size";
    }
    return h;
}

// ---- TIFF ----------------------------------------------------------------------------------

struct TiffEntry {
    uint64_t type = 0;
    uint64_t count = 0;
    size_t value_field = 0;  // offset of the inline value / out-of-line pointer
    bool present = false;
};

uint64_t tiff_type_size(uint64_t type) {
    switch (type) {
        case 1:
        case 2:
        case 6:
        case 7:
            return 1;  // BYTE, ASCII, SBYTE, UNDEFINED
        case 3:
        case 8:
            return 2;  // SHORT, SSHORT
        case 4:
        case 9:
        case 13:
            return 4;  // LONG, SLONG, IFD
        case 16:
        case 17:
        case 18:
            return 8;  // LONG8, SLONG8, IFD8
        default:
            return 0;
    }
}

ImageHeader read_tiff(const Bytes& b) {
    ImageHeader h;
    h.format = ImageFormat::kTIFF;
    const bool big_endian = b[0] == 'M';
    uint64_t magic = 0;
    b.load(2, 2, big_endian, &magic);
    const bool big_tiff = magic == 43;
    const int offset_bytes = big_tiff ? 8 : 4;
    const int count_bytes = big_tiff ? 8 : 2;
    const uint64_t entry_bytes = big_tiff ? 20 : 12;
    uint64_t ifd = 0;
    if (!b.load(big_tiff ? 8 : 4, offset_bytes, big_endian, &ifd)) {
        h.error = "TIFF: data ends in the file header";
        return h;
    }
    uint64_t count = 0;
    if (ifd > b.size() || !b.load(ifd, count_bytes, big_endian, &count)) {
        h.error = "TIFF: first IFD lies past the end of the data";
        return h;
    }
    const size_t first_entry = ifd + count_bytes;
    if (!b.has(first_entry, 0) || count > (b.size() - first_entry) / entry_bytes) {
        h.error = "TIFF: first IFD runs past the end of the data";
        return h;
    }
    TiffEntry width, length, orientation, strip_offsets, strip_counts, tile_offsets, tile_counts;
    for (uint64_t i = 0; i < count; ++i) {
        const size_t e = first_entry + i * entry_bytes;
        uint64_t tag = 0;
        TiffEntry entry;
        b.load(e, 2, big_endian, &tag);
        b.load(e + 2, 2, big_endian, &entry.type);
        b.load(e + 4, offset_bytes, big_endian, &entry.count);
        entry.value_field = e + 4 + offset_bytes;
        entry.present = true;
        const std::pair<uint64_t, TiffEntry*> wanted[] = {
            {256, &width},        {257, &length},       {273, &strip_offsets}, {274, &orientation},
            {279, &strip_counts}, {324, &tile_offsets}, {325, &tile_counts}};
        for (const auto& [wanted_tag, slot] : wanted) {
            if (tag == wanted_tag) *slot = entry;
        }
    }
    // Reads element i of an entry's array, inline or out of line; false when it is outside.
    auto element = [&](const TiffEntry& e, uint64_t i, uint64_t* out) {
        const uint64_t size = tiff_type_size(e.type);
        if (size == 0 || size == 1 || i >= e.count) return false;
        if (e.count > std::numeric_limits<uint64_t>::max() / size) return false;
        size_t base = e.value_field;
        if (e.count * size > static_cast<uint64_t>(offset_bytes)) {
            uint64_t pointer = 0;
            if (!b.load(e.value_field, offset_bytes, big_endian, &pointer)) return false;
            if (pointer > b.size() || i > (b.size() - pointer) / size) return false;
            base = pointer;
        }
        return b.load(base + i * size, static_cast<int>(size), big_endian, out);
    };
    uint64_t w = 0, l = 0;
    if (!width.present || !length.present || !element(width, 0, &w) || !element(length, 0, &l)) {
        h.error = "TIFF: no ImageWidth/ImageLength in the first IFD";
        return h;
    }
    h.width = clamp_to_int64(w);
    h.height = clamp_to_int64(l);
    uint64_t o = 0;
    if (orientation.present && element(orientation, 0, &o) && o >= 1 && o <= 8) {
        h.orientation = static_cast<int>(o);
    }
    const bool tiled = tile_offsets.present;
    h.tiled = tiled;
    const TiffEntry& offsets = tiled ? tile_offsets : strip_offsets;
    const TiffEntry& counts = tiled ? tile_counts : strip_counts;
    if (!offsets.present || !counts.present || offsets.count != counts.count ||
        offsets.count == 0) {
        h.truncated = "TIFF: missing or inconsistent strip/tile tables";
        return h;
    }
    for (uint64_t i = 0; i < offsets.count; ++i) {
        uint64_t offset = 0, bytes = 0;
        if (!element(offsets, i, &offset) || !element(counts, i, &bytes)) {
            h.truncated = "TIFF: strip/tile table runs past the end of the data";
            return h;
        }
        if (offset > b.size() || bytes > b.size() - offset) {
            h.truncated = "TIFF: strip/tile data runs past the end of the data";
            return h;
        }
    }
    return h;
}

}  // namespace

const char* image_format_name(ImageFormat format) {
    switch (format) {
        case ImageFormat::kJPEG:
            return "JPEG";
        case ImageFormat::kPNG:
            return "PNG";
        case ImageFormat::kWebP:
            return "WebP";
        case ImageFormat::kBMP:
            return "BMP";
        case ImageFormat::kTIFF:
            return "TIFF";
        case ImageFormat::kUnknown:
            break;
    }
    return "unknown";
}

ImageHeader read_image_header(const uint8_t* data, size_t size) {
    const Bytes b(data, size);
    if (b.equals(0, "\xFF\xD8\xFF", 3)) return read_jpeg(b);
    if (b.equals(0, "\x89PNG\r\n\x1A\n", 8)) return read_png(b);
    if (b.equals(0, "RIFF", 4) && b.equals(8, "WEBP", 4)) return read_webp(b);
    if (b.equals(0, "BM", 2)) return read_bmp(b);
    if (b.equals(0, "II*\0", 4) || b.equals(0, "MM\0*", 4) || b.equals(0, "II+\0", 4) ||
        b.equals(0, "MM\0+", 4)) {
        return read_tiff(b);
    }
    return {};
}

int exif_orientation(const uint8_t* tiff, size_t size) {
    Bytes b(tiff, size);
    if (b.equals(0, "Exif\0\0", 6)) b = Bytes(tiff + 6, size - 6);  // some writers keep the prefix
    bool big_endian = false;
    if (b.equals(0, "MM\0*", 4)) {
        big_endian = true;
    } else if (!b.equals(0, "II*\0", 4)) {
        return 1;
    }
    uint64_t ifd = 0, count = 0;
    if (!b.load(4, 4, big_endian, &ifd) || ifd > b.size() || !b.load(ifd, 2, big_endian, &count)) {
        return 1;
    }
    for (uint64_t i = 0; i < count; ++i) {
        const size_t e = ifd + 2 + i * 12;
        uint64_t tag = 0, type = 0, value = 0;
        if (!b.load(e, 2, big_endian, &tag) || !b.load(e + 2, 2, big_endian, &type)) return 1;
        if (tag != 0x0112) continue;
        const bool ok = type == 3   ? b.load(e + 8, 2, big_endian, &value)
                        : type == 4 ? b.load(e + 8, 4, big_endian, &value)
                                    : false;
        return ok && value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
    }
    return 1;
}

}  // namespace sf::stages
