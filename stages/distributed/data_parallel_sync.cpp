#include "stages/distributed/data_parallel_sync.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <map>
#include <tuple>

#include "core/check.h"

namespace sf::distributed {

void run_bucketed(const std::vector<at::Tensor>& tensors,
                  const std::function<void(std::vector<at::Tensor>& flat)>& collective) {
    c10::NoGradGuard no_grad;
    size_t i = 0;
    while (i < tensors.size()) {
        std::vector<at::Tensor> bucket;
        int64_t bytes = 0;
        for (; i < tensors.size() && (bucket.empty() || bytes < kBucketBytes); ++i) {
            bucket.push_back(tensors[i]);
            bytes += tensors[i].numel() * static_cast<int64_t>(tensors[i].element_size());
        }
        std::vector<at::Tensor> flat = {
            bucket.size() == 1 ? bucket[0].contiguous().view({-1}).clone() : at::cat([&] {
                std::vector<at::Tensor> views;
                for (const auto& t : bucket) views.push_back(t.reshape({-1}));
                return views;
            }())};
        collective(flat);
        int64_t offset = 0;
        for (const auto& t : bucket) {
            t.copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
            offset += t.numel();
        }
    }
}

std::vector<TensorGroup> group_alike(const std::vector<at::Tensor>& tensors,
                                     const std::vector<int>& tags) {
    std::vector<TensorGroup> groups;
    std::map<std::tuple<int, at::ScalarType, std::string>, size_t> index;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const int tag = tags.empty() ? 0 : tags[i];
        const auto key = std::make_tuple(tag, tensors[i].scalar_type(), tensors[i].device().str());
        auto [it, added] = index.emplace(key, groups.size());
        if (added) groups.push_back({tag, {}});
        groups[it->second].tensors.push_back(tensors[i]);
    }
    return groups;
}

GradientBuckets& DataParallelSync::buckets(const std::vector<at::Tensor>& params) {
    if (!buckets_) {
        buckets_ = std::make_unique<GradientBuckets>(
            params, bucket_tags(), bucket_bytes_,
            [this](const at::Tensor& flat, int tag) { return start_bucket(flat, tag); });
        bucket_params_ = params.size();
    }
    SF_CHECK(params.size() == bucket_params_, "the gradient buckets of another parameter list");
    return *buckets_;
}

PendingCollective DataParallelSync::start_bucket(const at::Tensor& flat, int /*tag*/) {
    return world_->start_all_reduce_sum({flat}, "the gradient all-reduce");
}

void DataParallelSync::begin_backward(const std::vector<at::Tensor>& params) {
    buckets(params).begin();
}

void DataParallelSync::grad_ready(size_t index) {
    SF_CHECK(buckets_ != nullptr, "grad_ready before begin_backward");
    buckets_->ready(index);
}

void DataParallelSync::reduce_all(const std::vector<at::Tensor>& params) {
    buckets(params).finish([this](int tag) { return keeps_bucket(tag); });
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
