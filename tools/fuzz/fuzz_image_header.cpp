// The image header sniffer (format, size, EXIF orientation) that runs before any decoder.
#include "fuzz_util.h"
#include "stages/image/image_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    sf::fuzz::refused_or_read([&] {
        sf::stages::read_image_header(data, size);
        sf::stages::exif_orientation(data, size);
    });
    return 0;
}
