// `sanaflow models`: every built-in configuration with its exact parameter count, computed from
// the configuration alone (nothing is allocated, so the 1.6B model lists as fast as the tiny one).
#pragma once

#include <string>

namespace sf::pipelines {

std::string models_table();

}  // namespace sf::pipelines
