#include "stages/distributed/zero_sharding.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/log.h"
#include "storage/tensor_convert.h"

namespace sf::distributed {

std::vector<int> partition_by_size(const std::vector<int64_t>& bytes, int world_size) {
    std::vector<size_t> order(bytes.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
    std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
    std::vector<int> owners(bytes.size(), 0);
    for (size_t i : order) {
        const auto least = std::min_element(load.begin(), load.end());  // the first of equals
        owners[i] = static_cast<int>(least - load.begin());
        *least += bytes[i];
    }
    return owners;
}

std::vector<bool> ShardedStateSync::partition(const std::vector<at::Tensor>& params) {
    std::vector<int64_t> bytes;
    for (const auto& p : params)
        bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    owners_ = partition_by_size(bytes, world_size());
    std::vector<bool> mine;
    for (int o : owners_) mine.push_back(o == rank());
    return mine;
}

int ShardedStateSync::owner(size_t index) const {
    SF_CHECK(index < owners_.size(), "a parameter outside the partition (partition() first)");
    return owners_[index];
}

PendingCollective ShardedStateSync::start_bucket(const at::Tensor& flat, int owner) {
    return world_->start_reduce_sum_to({flat}, owner, "the gradient reduce to its owner");
}

void ShardedStateSync::reduce_one(size_t index, const at::Tensor& param) {
    // As DataParallelSync::reduce_one: the sum goes into a buffer of its own.
    at::Tensor& g = const_cast<at::Tensor&>(param).mutable_grad();
    std::vector<at::Tensor> sum = {g.defined() ? g.clone(at::MemoryFormat::Contiguous)
                                               : at::zeros_like(param)};
    const int root = owner(index);
    world_->reduce_sum_to(sum, root, "the gradient reduce to its owner");
    g = root == rank() ? sum[0] : at::Tensor();
}

void ShardedStateSync::share_updates(const std::vector<at::Tensor>& params) {
    SF_CHECK(params.size() == owners_.size(), "share_updates over another parameter list");
    std::vector<at::Tensor> weights;
    for (const auto& p : params) weights.push_back(p.detach());
    for (const auto& group : group_alike(weights, owners_)) {
        run_bucketed(group.tensors, [&](std::vector<at::Tensor>& flat) {
            world_->broadcast(flat, group.tag, "the broadcast of updated weights from their owner");
        });
    }
}

std::map<std::string, at::Tensor> ShardedStateSync::gather_state(
    std::map<std::string, at::Tensor> mine) {
    // Each rank's part as safetensors bytes: their sizes to everyone, then each part to rank 0.
    std::string bytes;
    int64_t state_bytes = 0;
    for (const auto& [name, t] : mine) state_bytes += t.numel() * int64_t{t.element_size()};
    if (rank() > 0) {
        std::map<std::string, at::Tensor> host;
        std::map<std::string, storage::TensorView> views;
        for (const auto& [name, t] : mine) {
            host[name] = t.detach().to(at::kCPU).contiguous();
            views[name] = storage::view_of(host[name]);
        }
        bytes = storage::encode_safetensors(views, {});
    }
    // Per rank: the encoded size (what rank 0 receives) and the state's tensor bytes (the log).
    std::vector<at::Tensor> sizes = {at::zeros({2, world_size()}, at::kLong)};
    sizes[0][0][rank()] = static_cast<int64_t>(bytes.size());
    sizes[0][1][rank()] = state_bytes;
    world_->all_reduce_sum(sizes, "the exchange of optimizer state sizes");
    const at::Tensor each = sizes[0][0], held = sizes[0][1];
    if (rank() > 0) {
        at::Tensor buffer = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())},
                                          at::TensorOptions().dtype(at::kByte));
        world_->send(buffer, 0, "the optimizer state sent to rank 0");
        return mine;
    }
    for (int r = 1; r < world_size(); ++r) {
        at::Tensor buffer = at::empty({each[r].item<int64_t>()}, at::kByte);
        world_->recv(buffer, r, fmt::format("the optimizer state of rank {}", r));
        const std::string_view view(static_cast<const char*>(buffer.data_ptr()),
                                    static_cast<size_t>(buffer.numel()));
        const storage::Record part =
            storage::decode_safetensors(view, fmt::format("rank {}'s optimizer state", r));
        for (const auto& [name, data] : part.tensors) mine[name] = storage::from_tensor_data(data);
    }
    std::vector<int64_t> per_rank(held.data_ptr<int64_t>(),
                                  held.data_ptr<int64_t>() + world_size());
    log_info("ddp: optimizer state gathered from {} ranks (ZeRO-1), bytes per rank: {}",
             world_size(), fmt::join(per_rank, ", "));
    return mine;
}

}  // namespace sf::distributed
