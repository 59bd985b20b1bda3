// Helpers shared by the training tests (stages_train_test.cpp, stages_train_video_test.cpp).
#pragma once

#include <vector>

#include "stages/train/gradient_sync.h"

namespace sf::test {

// A one-process sync that counts how often each parameter's gradient is reported complete
// inside the last backward pass of a step (what the fused pass and the data-parallel overlap
// act on: it must be once).
class CountingSync final : public train::GradientSync {
public:
    bool reduces_during_backward() const override { return true; }
    void begin_backward(const std::vector<at::Tensor>& params) override {
        counts.assign(params.size(), 0);
    }
    void grad_ready(size_t index) override { ++counts.at(index); }
    std::vector<int> counts;
};

}  // namespace sf::test
