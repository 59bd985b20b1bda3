// The cache's record decoder: a zstd frame around safetensors bytes, as LMDB hands it over.
#include "fuzz_util.h"
#include "storage/tensor_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    sf::fuzz::refused_or_read([&] {
        // The latents db's limit: the largest a reader accepts.
        sf::storage::decode_record(sf::fuzz::as_text(data, size), "fuzz", uint64_t{512} << 20);
    });
    return 0;
}
