// How a refused checkpoint is reported, the same for full weights and LoRA adapters: per kind
// (missing, misshaped, unexpected) the count, then the names.
#pragma once

#include <string>
#include <vector>

namespace sf::model {

// Appends "\n  <n> <what>:" and up to 40 of `items`, one per line; nothing when empty.
void append_list(std::string& out, const char* what, const std::vector<std::string>& items);

}  // namespace sf::model
