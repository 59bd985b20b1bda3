// train::GradientSync across the ranks of a World: every rank's gradients summed (each rank's loss
// is already weighted by its share of the global micro-batch, so the sum is the global batch's
// gradient), in buckets of at most kBucketBytes flattened per dtype, each started inside the
// backward pass as soon as its gradients are complete (gradient_buckets.h), so communication
// overlaps the rest of the backward; with the fused backward pass each parameter's gradient as
// soon as it is complete, before its update. Only the trainable
// parameters TrainStep hands over are reduced (the adapters for LoRA).
#pragma once

#include <functional>
#include <memory>

#include "stages/distributed/gradient_buckets.h"
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
    // `bucket_bytes`: the cap of a bucket of gradients (DDP's bucket_cap_mb).
    explicit DataParallelSync(std::shared_ptr<World> world, int64_t bucket_bytes = kBucketBytes)
        : world_(std::move(world)), bucket_bytes_(bucket_bytes) {}

    bool reduces_during_backward() const override { return true; }
    void begin_backward(const std::vector<at::Tensor>& params) override;
    void grad_ready(size_t index) override;
    // Finishes what the backward started (or all of it, when nothing did).
    void reduce_all(const std::vector<at::Tensor>& params) override;
    void reduce_one(size_t index, const at::Tensor& param) override;
    double reduce_sum(double value) override;
    void broadcast_parameters(const std::vector<at::Tensor>& params) override;
    void barrier(const std::string& what) override;

    int rank() const override { return world_->rank(); }
    int world_size() const override { return world_->size(); }

    // Buckets started inside the last backward pass (of how many); 0 of 0 before the first.
    int64_t buckets_started_in_backward() const {
        return buckets_ ? buckets_->started_in_backward() : 0;
    }
    size_t bucket_count() const { return buckets_ ? buckets_->bucket_count() : 0; }

protected:
    // How a bucket is reduced: summed on every rank here; ZeRO-1 sums it on its owner only
    // (the tag), and the other ranks keep none of it.
    virtual std::vector<int> bucket_tags() const { return {}; }
    virtual PendingCollective start_bucket(const at::Tensor& flat, int tag);
    virtual bool keeps_bucket(int /*tag*/) const { return true; }

    std::shared_ptr<World> world_;

private:
    GradientBuckets& buckets(const std::vector<at::Tensor>& params);
    int64_t bucket_bytes_;
    std::unique_ptr<GradientBuckets> buckets_;  // laid out at the first use
    size_t bucket_params_ = 0;                  // how many parameters they were laid out for
};

}  // namespace sf::distributed
