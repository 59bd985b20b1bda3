// train::GradientSync across the ranks of a World: every rank's gradients summed (each rank's loss
// is already weighted by its share of the global micro-batch, so the sum is the global batch's
// gradient), in buckets of at most kBucketBytes flattened per dtype; with the fused backward pass
// each parameter's gradient as soon as it is complete, before its update. Only the trainable
// parameters TrainStep hands over are reduced (the adapters for LoRA).
#pragma once

#include <functional>
#include <memory>

#include "stages/distributed/world.h"
#include "stages/train/gradient_sync.h"

namespace sf::distributed {

constexpr int64_t kBucketBytes = int64_t{25} << 20;  // DDP's default bucket_cap_mb

// Runs `collective` on flat buckets of at most kBucketBytes (one tensor may exceed it) made of
// `tensors` (one dtype and device, in order) and copies each bucket's result back into them.
void run_bucketed(const std::vector<at::Tensor>& tensors,
                  const std::function<void(std::vector<at::Tensor>& flat)>& collective);

// `tensors` split by (tag, dtype, device), each group in order, the groups in order of first
// appearance: the same groups on every rank when the tensors and tags are. No tags: all 0.
struct TensorGroup {
    int tag = 0;
    std::vector<at::Tensor> tensors;
};
std::vector<TensorGroup> group_alike(const std::vector<at::Tensor>& tensors,
                                     const std::vector<int>& tags = {});

class DataParallelSync : public train::GradientSync {
public:
    explicit DataParallelSync(std::shared_ptr<World> world) : world_(std::move(world)) {}

    void reduce_all(const std::vector<at::Tensor>& params) override;
    // Every parameter's gradient; one that got none here takes part as zeros, so every rank
    // sends the same buckets.
    static std::vector<at::Tensor> grads_or_zeros(const std::vector<at::Tensor>& params);
    void reduce_one(size_t index, const at::Tensor& param) override;
    double reduce_sum(double value) override;
    void broadcast_parameters(const std::vector<at::Tensor>& params) override;
    void barrier(const std::string& what) override;

    int rank() const override { return world_->rank(); }
    int world_size() const override { return world_->size(); }

protected:
    std::shared_ptr<World> world_;
};

}  // namespace sf::distributed
