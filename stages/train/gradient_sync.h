// The point in a training step where data-parallel training makes every rank's gradients the
// same (an all-reduce averaging them), and what a rank may write. One process needs nothing: the
// default does nothing and writes everything. TrainStep calls it
//
//   - reduce_all: once per optimizer step, after the last micro-batch's backward and before the
//     loss scaler's check, clipping and the update (every gradient of this rank is complete);
//   - reduce_one: with the fused backward pass instead, for each parameter as soon as its
//     gradient is complete and before that parameter's update, from inside the backward pass
//     (so communication can overlap the rest of the backward).
//
//   - with reduces_during_backward(), reduce_all's work starts earlier: begin_backward before the
//     last backward pass of a step and grad_ready(i) from inside it, as soon as parameter i's
//     gradient is complete (its accumulator ran: once per backward pass with every remedy), so
//     communication overlaps the rest of the backward; reduce_all then finishes it.
//
// Accumulation calls none of these before the last micro-batch: gradients are reduced once per
// step. Each rank weights its loss by its share of the global micro-batch (TrainStep), so the
// reduction is a sum. The step's loss is summed once per step too (reduce_sum), and a run
// broadcasts rank 0's weights before its first step and meets at a barrier after each checkpoint.
//
// With the optimizer state sharded (ZeRO-1, --shard_optimizer_state) each parameter has one owner
// rank (partition): the reductions leave the summed gradient with the owner only (the others drop
// theirs), the owner alone updates it and keeps its AdamW state, and share_updates hands the new
// weights from each owner to every rank. Checks that need every gradient (the loss scaler's,
// clipping's global norm) then add up each rank's part (reduce_sum).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace sf::train {

class GradientSync {
public:
    virtual ~GradientSync() = default;

    virtual void reduce_all(const std::vector<at::Tensor>& /*params*/) {}
    virtual void reduce_one(size_t /*index*/, const at::Tensor& /*param*/) {}
    virtual bool reduces_during_backward() const { return false; }
    virtual void begin_backward(const std::vector<at::Tensor>& /*params*/) {}
    virtual void grad_ready(size_t /*index*/) {}
    virtual double reduce_sum(double value) { return value; }
    virtual void broadcast_parameters(const std::vector<at::Tensor>& /*params*/) {}
    virtual void barrier(const std::string& /*what*/) {}

    // ZeRO-1: whether each parameter's state lives on one rank only.
    virtual bool shards_state() const { return false; }
    // Which of `params` (all trainable parameters, the same list on every rank) this rank
    // updates; remembered for the reductions. Every one unless the state is sharded.
    virtual std::vector<bool> partition(const std::vector<at::Tensor>& params) {
        return std::vector<bool>(params.size(), true);
    }
    // After an update: every parameter's new weights from its owner to every rank.
    virtual void share_updates(const std::vector<at::Tensor>& /*params*/) {}
    // Every rank's optimizer state (AdamW::state()) gathered into one map, complete on rank 0
    // (the writer of checkpoints); every rank must call it.
    virtual std::map<std::string, at::Tensor> gather_state(std::map<std::string, at::Tensor> mine) {
        return mine;
    }

    virtual int rank() const { return 0; }
    virtual int world_size() const { return 1; }
    // Checkpoints, final weights and summaries are written by rank 0 only: every rank holds
    // the same weights, and one writer keeps the files whole.
    bool writes_files() const { return rank() == 0; }
};

}  // namespace sf::train
