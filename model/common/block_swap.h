// Block swap (--blocks_to_swap, as musubi-tuner spells it): the weights of the first N
// transformer blocks live in host memory (pinned when the device is CUDA) and are lent to the
// device for each run of the block: its forward, and the recompute of its backward. A swapped
// block is always run under gradient checkpointing (model/common/checkpoint.h), so nothing
// between the two runs refers to its weights on the device; its gradients are computed there and
// copied back beside the host weights, where the optimizer updates them.
//
// While one block runs, the next one is copied ahead: block i + 1 in the forward, block i - 1 in
// the backward's recomputes (the order the checkpoints run them). On CUDA that copy runs on a
// side stream, overlapped with the block's compute, and the compute stream waits for it only when
// the block starts. The device then holds the weights of at most two swapped blocks at a time
// instead of N. A copy made ahead for a block that does not run next is dropped (begin_pass()
// drops it at the start of every forward, so a copy never outlives the weights it was made of).
//
// On the CPU the "device" copy is a real copy too, made ahead in the same order (without a side
// stream there is nothing to overlap), so the path is the one CUDA takes (and its results must be
// bit-identical to a run without swapping), and the host side lives outside the counting
// allocator (core/host_memory.h): the counted peak falls as a card's would.
#pragma once

#include <c10/core/Device.h>

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
    BlockSwap();
    // Swaps blocks [0, n) of `blocks` (moved to host memory now) to `device`; n = 0 swaps none
    // and puts the earlier swapped blocks back on `device`. n > blocks.size() is
    // kInvalidArgument.
    void set(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, int64_t n,
             c10::Device device);
    int64_t count() const;
    bool swapped(size_t block) const;
    // A forward pass of the model begins: a block copied ahead and not yet run is dropped.
    void begin_pass();
    // What checkpoint() holds around each run of swapped block `block`: its weights, and the
    // gradients they have so far, on the device; released, the gradients go back to the host.
    // Entering it also starts the copy of the block expected to run next.
    CheckpointScope scope(size_t block);
    // Copies of a block's weights to the device so far, and how many of them were made ahead.
    int64_t copies() const;
    int64_t copies_ahead() const;

private:
    struct State;
    std::shared_ptr<State> state_;
};

}  // namespace sf::model
