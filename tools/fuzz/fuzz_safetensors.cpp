// The safetensors parser on a buffer (cache records, after decompression).
#include "fuzz_util.h"
#include "storage/tensor_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    sf::fuzz::refused_or_read(
        [&] { sf::storage::decode_safetensors(sf::fuzz::as_text(data, size), "fuzz"); });
    return 0;
}
