// A checkpoint's state.json and manifest.json, and the cache's fingerprint and reject entries;
// the first byte picks which.
#include "fuzz_util.h"
#include "stages/train/state_json.h"
#include "storage/cache.h"
#include "storage/fingerprint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string text(sf::fuzz::as_text(data + 1, size - 1));
    sf::fuzz::refused_or_read([&] {
        switch (data[0] % 4) {
            case 0:
                sf::train::state_json(sf::train::parse_state_json(text, "state.json"));
                break;
            case 1:
                sf::train::manifest_json(sf::train::parse_manifest_json(text, "manifest.json"));
                break;
            case 2:
                sf::storage::fingerprint_to_json(sf::storage::fingerprint_from_json(text, "fp"));
                break;
            default:
                sf::storage::reject_to_json(sf::storage::reject_from_json(text, "reject"));
        }
    });
    return 0;
}
