// The shard index (*.safetensors.index.json) of a sharded checkpoint, beside one real shard.
#include "fuzz_util.h"
#include "storage/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool shard = [] {
        sf::storage::Record r;
        r.tensors["a"] = {sf::storage::DType::kF32, {2}, std::string(8, '\1')};
        sf::storage::write_safetensors_file(sf::fuzz::scratch_dir() + "/s.safetensors", r);
        return true;
    }();
    (void)shard;
    const std::string path =
        sf::fuzz::scratch_file("m.safetensors.index.json", sf::fuzz::as_text(data, size));
    sf::fuzz::refused_or_read([&] {
        const auto checkpoint = sf::storage::SafetensorsCheckpoint::open(path);
        for (const auto& name : checkpoint.names()) checkpoint.read(name);
    });
    return 0;
}
