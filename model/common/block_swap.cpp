#include "model/common/block_swap.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <utility>

#include "core/check.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace sf::model {
namespace {

// A module's parameters and buffers on the device for the guard's lifetime, each gradient with
// its parameter; the destructor points them back at their host data and copies the gradients
// (the ones they had, with what this run added) back to the host.
class Lent {
public:
    Lent(torch::nn::Module& module, c10::Device device) : pinned_(device.is_cuda()) {
        for (at::Tensor p : module.parameters()) lend(p, device);
        for (at::Tensor b : module.buffers()) lend(b, device);
    }
    ~Lent() {
        for (auto& [t, host, host_grad] : lent_) {
            at::Tensor grad = t.grad();
            if (grad.defined()) t.mutable_grad() = at::Tensor();
            t.set_data(host);
            if (!grad.defined()) continue;
            // Into the host gradient it had (the device's began as its copy), else a new one.
            if (host_grad.defined() && host_grad.sizes() == grad.sizes()) {
                host_grad.copy_(grad);
            } else {
                host_grad = mem::to_host(grad, pinned_);
            }
            t.mutable_grad() = host_grad;
        }
    }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;

private:
    void lend(at::Tensor t, c10::Device device) {
        const at::Tensor host = t.data();
        const at::Tensor grad = t.grad();
        if (grad.defined()) t.mutable_grad() = at::Tensor();
        t.set_data(host.to(device, /*non_blocking=*/true, /*copy=*/true));
        if (grad.defined()) t.mutable_grad() = grad.to(device, /*non_blocking=*/true, true);
        lent_.push_back({t, host, grad});
    }
    struct Entry {
        at::Tensor tensor, host, host_grad;  // the module's tensor, its host data and gradient
    };
    std::vector<Entry> lent_;
    bool pinned_;
};

// To host memory (mem::to_host: pinned for a CUDA device) or back to the device.
void move_to(torch::nn::Module& m, c10::Device device, bool host, bool pinned) {
    auto move = [&](at::Tensor t) {
        t.set_data(host ? mem::to_host(t.data(), pinned)
                        : t.data().to(device, /*non_blocking=*/false, /*copy=*/true));
    };
    for (at::Tensor p : m.parameters()) move(p);
    for (at::Tensor b : m.buffers()) move(b);
}

}  // namespace

void BlockSwap::set(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, int64_t n,
                    c10::Device device) {
    if (n < 0 || n > static_cast<int64_t>(blocks.size())) {
        throw Error::InvalidArgument(
            fmt::format("--blocks_to_swap {}: the transformer has {} blocks", n, blocks.size()));
    }
    for (const auto& block : swapped_) move_to(*block, device_, /*host=*/false, false);
    swapped_.assign(blocks.begin(), blocks.begin() + n);
    device_ = device;
    for (const auto& block : swapped_) move_to(*block, device, /*host=*/true, device.is_cuda());
}

CheckpointScope BlockSwap::scope(size_t block) {
    SF_CHECK(block < swapped_.size(), "scope() of a block that is not swapped");
    return [module = swapped_[block], device = device_, copies = copies_] {
        copies->fetch_add(1);
        return std::shared_ptr<void>(std::make_shared<Lent>(*module, device));
    };
}

}  // namespace sf::model
