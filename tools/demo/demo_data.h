// Generates the demo's dataset: images of simple shapes at several sizes and aspect ratios, each
// with a same-stem caption, plus two deliberately bad files so the demo shows rejection.
#pragma once

#include <string>

namespace sf::tools {

struct DemoDataStats {
    int images = 0;
    int bad_files = 0;
};

DemoDataStats write_demo_dataset(const std::string& dir, int count, unsigned seed);

}  // namespace sf::tools
