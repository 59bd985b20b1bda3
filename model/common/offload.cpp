#include "model/common/offload.h"

#include <torch/torch.h>

namespace sf::model {

WeightsOnDevice::WeightsOnDevice(torch::nn::Module& module, c10::Device device) {
    for (auto t : module.parameters()) move(t, device);
    for (auto t : module.buffers()) move(t, device);
}

WeightsOnDevice::~WeightsOnDevice() {
    for (auto& [t, host] : moved_) t.set_data(host);
}

void WeightsOnDevice::move(at::Tensor t, c10::Device device) {
    if (t.device() == device) return;
    at::Tensor host = t.data();
    t.set_data(host.to(device, /*non_blocking=*/true));
    moved_.emplace_back(t, host);
}

}  // namespace sf::model
