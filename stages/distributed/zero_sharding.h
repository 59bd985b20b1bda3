// ZeRO stage 1 (--shard_optimizer_state): each trainable parameter has one owner rank, which alone
// keeps its AdamW state and updates it, so each rank holds about 1/N of the optimizer state (and,
// after the reduction, of the gradients). The partition is torch's ZeroRedundancyOptimizer's:
// parameters by descending size, each to the rank with the fewest bytes so far (ties: the lower
// rank, then parameter order), the same on every rank.
//
// A step: the gradients are summed into their owner (c10d reduce, in buckets of kBucketBytes per
// owner and dtype, started inside the backward as DataParallelSync's; the other ranks drop
// theirs), each owner updates what it owns, and the new
// weights go from each owner to every rank (broadcast, bucketed alike). Checkpoints gather every
// rank's state on rank 0 into the same optimizer.safetensors an unsharded run writes, so a run
// resumes on any number of ranks, sharded or not.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stages/distributed/data_parallel_sync.h"

namespace sf::distributed {

// The owner rank of each parameter, given their byte sizes.
std::vector<int> partition_by_size(const std::vector<int64_t>& bytes, int world_size);

class ShardedStateSync final : public DataParallelSync {
public:
    explicit ShardedStateSync(std::shared_ptr<World> world) : DataParallelSync(std::move(world)) {}

    bool shards_state() const override { return true; }
    std::vector<bool> partition(const std::vector<at::Tensor>& params) override;
    void reduce_one(size_t index, const at::Tensor& param) override;
    void share_updates(const std::vector<at::Tensor>& params) override;
    std::map<std::string, at::Tensor> gather_state(std::map<std::string, at::Tensor> mine) override;

protected:
    std::vector<int> bucket_tags() const override { return owners_; }
    PendingCollective start_bucket(const at::Tensor& flat, int owner) override;
    // What is not ours is summed elsewhere: dropped here, so unscaling, clipping and the update
    // see this rank's share only.
    bool keeps_bucket(int owner) const override { return owner == rank(); }

private:
    int owner(size_t index) const;
    std::vector<int> owners_;  // per parameter, from partition()
};

}  // namespace sf::distributed
