// Block swap (--blocks_to_swap, as musubi-tuner spells it): the weights of the first N
// transformer blocks live in host memory (pinned when the device is CUDA) and are lent to the
// device for each run of the block: its forward, and the recompute of its backward. A swapped
// block is always run under gradient checkpointing (model/common/checkpoint.h), so nothing
// between the two runs refers to its weights on the device; its gradients are computed there and
// copied back beside the host weights, where the optimizer updates them. The device then holds
// the weights of one swapped block at a time instead of N.
//
// On the CPU the "device" copy is a real copy too, so the path is the one CUDA takes (and its
// results must be bit-identical to a run without swapping), and the host side lives outside the
// counting allocator (core/host_memory.h): the counted peak falls as a card's would.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/common/checkpoint.h"

namespace torch::nn {
class Module;
}

namespace sf::model {

class BlockSwap {
public:
    // Swaps blocks [0, n) of `blocks` (moved to host memory now) to `device`; n = 0 swaps none
    // and puts the earlier swapped blocks back on `device`. n > blocks.size() is
    // kInvalidArgument.
    void set(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, int64_t n,
             c10::Device device);
    int64_t count() const { return static_cast<int64_t>(swapped_.size()); }
    bool swapped(size_t block) const { return block < swapped_.size(); }
    // What checkpoint() holds around each run of swapped block `block`: its weights, and the
    // gradients they have so far, on the device; released, the gradients go back to the host.
    CheckpointScope scope(size_t block);
    // Blocks lent to the device so far (each lend copies the block's weights once).
    int64_t copies() const { return copies_->load(); }

private:
    std::vector<std::shared_ptr<torch::nn::Module>> swapped_;
    c10::Device device_ = c10::Device(c10::kCPU);
    std::shared_ptr<std::atomic<int64_t>> copies_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace sf::model
