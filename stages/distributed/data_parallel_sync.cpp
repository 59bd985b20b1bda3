#include "stages/distributed/data_parallel_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

namespace sf::distributed {
namespace {

// Sums `grads` (one dtype and device) across the ranks through flat buckets, in place.
void reduce_bucketed(World& world, const std::vector<at::Tensor>& grads) {
    size_t i = 0;
    while (i < grads.size()) {
        std::vector<at::Tensor> bucket;
        int64_t bytes = 0;
        for (; i < grads.size() && (bucket.empty() || bytes < kBucketBytes); ++i) {
            bucket.push_back(grads[i]);
            bytes += grads[i].numel() * static_cast<int64_t>(grads[i].element_size());
        }
        std::vector<at::Tensor> flat = {
            bucket.size() == 1 ? bucket[0].contiguous().view({-1}).clone() : at::cat([&] {
                std::vector<at::Tensor> views;
                for (const auto& g : bucket) views.push_back(g.reshape({-1}));
                return views;
            }())};
        world.all_reduce_sum(flat, "the gradient all-reduce");
        int64_t offset = 0;
        for (const auto& g : bucket) {
            g.copy_(flat[0].narrow(0, offset, g.numel()).view_as(g));
            offset += g.numel();
        }
    }
}

}  // namespace

void DataParallelSync::reduce_all(const std::vector<at::Tensor>& params) {
    // Per dtype and device, in parameter order (the same on every rank). A parameter that got
    // no gradient here takes part as zeros, so every rank sends the same buckets.
    std::map<std::pair<at::ScalarType, std::string>, std::vector<at::Tensor>> groups;
    std::vector<std::pair<at::ScalarType, std::string>> order;
    for (const auto& p : params) {
        at::Tensor& g = const_cast<at::Tensor&>(p).mutable_grad();
        if (!g.defined()) g = at::zeros_like(p);
        const auto key = std::make_pair(g.scalar_type(), g.device().str());
        if (groups.find(key) == groups.end()) order.push_back(key);
        groups[key].push_back(g);
    }
    for (const auto& key : order) reduce_bucketed(*world_, groups[key]);
}

void DataParallelSync::reduce_one(size_t /*index*/, const at::Tensor& param) {
    // Inside the backward pass the gradient's buffer may still be an input of a node yet to run
    // (autograd hands one buffer to several edges): the sum goes into a buffer of its own.
    at::Tensor& g = const_cast<at::Tensor&>(param).mutable_grad();
    std::vector<at::Tensor> sum = {g.defined() ? g.clone(at::MemoryFormat::Contiguous)
                                               : at::zeros_like(param)};
    world_->all_reduce_sum(sum, "the gradient all-reduce");
    g = sum[0];
}

double DataParallelSync::reduce_sum(double value) {
    std::vector<at::Tensor> t = {at::full({1}, value, at::TensorOptions().dtype(at::kDouble))};
    world_->all_reduce_sum(t, "the loss all-reduce");
    return t[0].item<double>();
}

void DataParallelSync::broadcast_parameters(const std::vector<at::Tensor>& params) {
    c10::NoGradGuard no_grad;
    for (const auto& p : params) {
        std::vector<at::Tensor> t = {p.detach().contiguous()};
        world_->broadcast(t, 0, "the broadcast of rank 0's weights");
        if (!t[0].is_same(p)) p.detach().copy_(t[0]);
    }
}

void DataParallelSync::barrier(const std::string& what) { world_->barrier(what); }

}  // namespace sf::distributed
