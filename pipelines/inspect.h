// `sanaflow inspect`: what a cache holds, and with verify, whether every record is intact.
#pragma once

#include <string>

namespace sf::pipelines {

struct InspectResult {
    std::string text;  // the printed report
    bool ok = true;    // false when verification found a corrupt record
};

InspectResult inspect_cache(const std::string& cache_dir, bool verify);

}  // namespace sf::pipelines
