// The safetensors file reader (model weights, checkpoints): opened, checksum verified, every
// tensor read.
#include "fuzz_util.h"
#include "storage/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = sf::fuzz::scratch_file("m.safetensors", sf::fuzz::as_text(data, size));
    sf::fuzz::refused_or_read([&] {
        const auto file = sf::storage::SafetensorsFile::open(path);
        for (const auto& name : file.names()) file.read(name);
    });
    return 0;
}
