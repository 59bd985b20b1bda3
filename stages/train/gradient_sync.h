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
// Accumulation calls neither before the last micro-batch: gradients are reduced once per step.
// Each rank weights its loss by its share of the global micro-batch (TrainStep), so the reduction
// is a sum. The step's loss is summed once per step too (reduce_sum), and a run broadcasts rank
// 0's weights before its first step and meets at a barrier after each checkpoint.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

namespace sf::train {

class GradientSync {
public:
    virtual ~GradientSync() = default;

    virtual void reduce_all(const std::vector<at::Tensor>& /*params*/) {}
    virtual void reduce_one(size_t /*index*/, const at::Tensor& /*param*/) {}
    virtual double reduce_sum(double value) { return value; }
    virtual void broadcast_parameters(const std::vector<at::Tensor>& /*params*/) {}
    virtual void barrier(const std::string& /*what*/) {}

    virtual int rank() const { return 0; }
    virtual int world_size() const { return 1; }
    // Checkpoints, final weights and summaries are written by rank 0 only: every rank holds
    // the same weights, and one writer keeps the files whole.
    bool writes_files() const { return rank() == 0; }
};

}  // namespace sf::train
