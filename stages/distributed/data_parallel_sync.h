// train::GradientSync across the ranks of a World: every rank's gradients summed (each rank's loss
// is already weighted by its share of the global micro-batch, so the sum is the global batch's
// gradient), in buckets of at most kBucketBytes flattened per dtype; with the fused backward pass
// each parameter's gradient as soon as it is complete, before its update. Only the trainable
// parameters TrainStep hands over are reduced (the adapters for LoRA).
#pragma once

#include <memory>

#include "stages/distributed/world.h"
#include "stages/train/gradient_sync.h"

namespace sf::distributed {

constexpr int64_t kBucketBytes = int64_t{25} << 20;  // DDP's default bucket_cap_mb

class DataParallelSync final : public train::GradientSync {
public:
    explicit DataParallelSync(std::shared_ptr<World> world) : world_(std::move(world)) {}

    void reduce_all(const std::vector<at::Tensor>& params) override;
    void reduce_one(size_t index, const at::Tensor& param) override;
    double reduce_sum(double value) override;
    void broadcast_parameters(const std::vector<at::Tensor>& params) override;
    void barrier(const std::string& what) override;

    int rank() const override { return world_->rank(); }
    int world_size() const override { return world_->size(); }

private:
    std::shared_ptr<World> world_;
};

}  // namespace sf::distributed
