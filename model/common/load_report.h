// How a refused checkpoint is reported, the same for full weights and LoRA adapters: per kind
// (missing, misshaped, unexpected) the count, then the names.
#pragma once

#include <c10/util/ArrayRef.h>

#include <string>
#include <vector>

namespace sf::model {

// "[2, 3]"
std::string shape_string(c10::IntArrayRef shape);
// Appends "\n  <n> <what>:" and up to 40 of `items`, one per line; nothing when empty.
void append_list(std::string& out, const char* what, const std::vector<std::string>& items);

}  // namespace sf::model
