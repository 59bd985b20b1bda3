// A step's gradients in buckets whose collectives start inside the backward pass, as
// DistributedDataParallel's reducer does: the buckets are laid out once, the parameters in
// reverse order (the order the backward completes them) grouped by (tag, dtype, device) and cut
// at kBucketBytes; each bucket starts as soon as every gradient in it is complete and every
// bucket before it has started, so every rank starts the same collectives in the same order.
// finish() starts what did not start (gradients that never completed: zeros, or the ones set
// outside autograd, as block swap's), waits for all, and leaves each sum in its gradient.
//
// A started bucket holds the gradients flattened, and the parameters hold none until finish()
// (memory as without overlap). A gradient completed a second time after its bucket started
// (a parameter whose accumulator ran twice in one backward pass) is reduced on its own in
// finish() and added, so the result stays the sum.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "stages/distributed/world.h"

namespace sf::distributed {

class GradientBuckets {
public:
    // Starts a bucket's collective on `flat` (one tensor) for group `tag`.
    using Start = std::function<PendingCollective(const at::Tensor& flat, int tag)>;

    // `tags`: per parameter (ZeRO-1: the owner rank), or empty for all 0. `bucket_bytes`: the
    // cap of a bucket (one tensor may exceed it).
    GradientBuckets(const std::vector<at::Tensor>& params, const std::vector<int>& tags,
                    int64_t bucket_bytes, Start start);

    // A new backward pass: what an interrupted one started is waited for and dropped.
    void begin();
    // From inside the backward pass: parameter `index`'s gradient is complete. Safe to call
    // from several threads at once: the autograd engine runs each device's nodes on a thread of
    // that device's, so accumulators of parameters on two devices (the CPU and a GPU) call it
    // concurrently.
    void ready(size_t index);
    // Everything started and waited for; each parameter's gradient is the sum (on every rank,
    // or on the owner for a reduce), or undefined where `keep(tag)` says so.
    void finish(const std::function<bool(int tag)>& keep);

    size_t bucket_count() const { return buckets_.size(); }
    // Buckets started from ready() during the last backward pass, before finish().
    int64_t started_in_backward() const { return started_in_backward_; }

private:
    struct Bucket {
        int tag = 0;
        std::vector<size_t> members;  // parameter indices
        size_t complete = 0;
        at::Tensor flat;  // while started: the gradients, flattened
        PendingCollective pending;
    };
    void start(Bucket& b);
    void start_ready_in_order();
    // Nothing complete, nothing started (buckets [0, next_) have started: they start in order).
    void reset();

    std::vector<at::Tensor> params_;
    Start start_;
    std::vector<Bucket> buckets_;
    std::vector<size_t> bucket_of_;  // per parameter
    std::vector<int> completions_;   // per parameter, this backward
    size_t next_ = 0;                // the first bucket not started
    std::mutex ready_mutex_;         // ready()'s: the counts above and the buckets' starts
    int64_t started_in_backward_ = 0;
};

}  // namespace sf::distributed
