// Weights kept in host memory and lent to the device for one computation: the text encoder's
// layer-by-layer offload today, block swap of transformer blocks in training next.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace sf::model {

// A module's parameters and buffers copied to `device` for the guard's lifetime; the host
// tensors are put back by the destructor, with no copy from the device: for frozen weights
// nothing changed there. (Trainable weights need their update copied back: block swap's job.)
class WeightsOnDevice {
public:
    WeightsOnDevice(torch::nn::Module& module, c10::Device device);
    ~WeightsOnDevice();
    WeightsOnDevice(const WeightsOnDevice&) = delete;
    WeightsOnDevice& operator=(const WeightsOnDevice&) = delete;

private:
    void move(at::Tensor t, c10::Device device);
    std::vector<std::pair<at::Tensor, at::Tensor>> moved_;  // (the module's tensor, its host data)
};

}  // namespace sf::model
