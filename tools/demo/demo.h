// `sanaflow demo`: generated images (and a few generated clips) prepped, inspected and trained on
// with the built-in tiny models, printing each step's command line and result.
#pragma once

#include <string>

namespace sf::tools {

// Returns the exit status (3 when the cache it made does not verify).
int run_demo(const std::string& out_dir, int num_images);

}  // namespace sf::tools
