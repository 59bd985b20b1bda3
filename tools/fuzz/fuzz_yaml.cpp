// The --config YAML file of prep and train, expanded into flags.
#include "fuzz_util.h"
#include "tools/cli/yaml_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = sf::fuzz::scratch_file("c.yaml", sf::fuzz::as_text(data, size));
    const char* argv[] = {"sanaflow", "train", "--config", path.c_str(), "--seed", "1"};
    sf::fuzz::refused_or_read([&] { sf::tools::expand_yaml_config(6, argv); });
    return 0;
}
