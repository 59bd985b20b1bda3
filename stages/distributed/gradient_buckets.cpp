#include "stages/distributed/gradient_buckets.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <tuple>

#include "core/check.h"
#include "core/log.h"

namespace sf::distributed {
namespace {

at::Tensor& grad_of(const at::Tensor& param) {
    return const_cast<at::Tensor&>(param).mutable_grad();
}

}  // namespace

GradientBuckets::GradientBuckets(const std::vector<at::Tensor>& params,
                                 const std::vector<int>& tags, int64_t bucket_bytes, Start start)
    : params_(params),
      start_(std::move(start)),
      bucket_of_(params.size()),
      completions_(params.size(), 0) {
    SF_CHECK(tags.empty() || tags.size() == params.size(), "one tag per parameter");
    // The open bucket of each group; a group's buckets fill in reverse parameter order.
    std::map<std::tuple<int, at::ScalarType, std::string>, size_t> open;
    std::vector<int64_t> bytes;
    for (size_t k = params.size(); k-- > 0;) {
        const at::Tensor& p = params[k];
        const int tag = tags.empty() ? 0 : tags[k];
        const auto key = std::make_tuple(tag, p.scalar_type(), p.device().str());
        const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
        auto it = open.find(key);
        if (it == open.end() || bytes[it->second] >= bucket_bytes) {
            buckets_.push_back({});
            buckets_.back().tag = tag;
            bytes.push_back(0);
            it = open.insert_or_assign(key, buckets_.size() - 1).first;
        }
        buckets_[it->second].members.push_back(k);
        bytes[it->second] += size;
        bucket_of_[k] = it->second;
    }
}

void GradientBuckets::begin() {
    for (Bucket& b : buckets_) b.pending.wait();
    reset();
    started_in_backward_ = 0;
}

void GradientBuckets::reset() {
    for (Bucket& b : buckets_) {
        b.flat = at::Tensor();
        b.complete = 0;
    }
    std::fill(completions_.begin(), completions_.end(), 0);
    next_ = 0;
}

void GradientBuckets::ready(size_t index) {
    SF_CHECK(index < params_.size(), "a gradient outside the buckets");
    const std::lock_guard<std::mutex> lock(ready_mutex_);
    if (++completions_[index] > 1) return;  // a second completion: finish() reduces it apart
    ++buckets_[bucket_of_[index]].complete;
    const size_t before = next_;
    start_ready_in_order();
    started_in_backward_ += static_cast<int64_t>(next_ - before);
}

void GradientBuckets::start_ready_in_order() {
    while (next_ < buckets_.size() && buckets_[next_].complete == buckets_[next_].members.size()) {
        start(buckets_[next_++]);
    }
}

void GradientBuckets::start(Bucket& b) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (size_t k : b.members) {
        const at::Tensor& g = grad_of(params_[k]);
        parts.push_back(g.defined() ? g.reshape({-1})
                                    : at::zeros({params_[k].numel()}, params_[k].options()));
    }
    b.flat = parts.size() == 1 ? parts[0].clone(at::MemoryFormat::Contiguous) : at::cat(parts);
    parts.clear();
    // The flat copy stands in for the gradients until finish(): dropping them keeps the memory
    // as it was (autograd may still hold a buffer it handed over; it keeps its own reference).
    for (size_t k : b.members) grad_of(params_[k]) = at::Tensor();
    b.pending = start_(b.flat, b.tag);
}

void GradientBuckets::finish(const std::function<bool(int tag)>& keep) {
    // What completed twice holds only its later share now (the first went into its bucket).
    std::vector<size_t> late;
    for (size_t k = 0; k < params_.size(); ++k) {
        if (completions_[k] > 1 && bucket_of_[k] < next_) late.push_back(k);
    }
    std::vector<at::Tensor> late_grads;
    for (size_t k : late) {
        late_grads.push_back(grad_of(params_[k]).defined() ? grad_of(params_[k])
                                                           : at::zeros_like(params_[k]));
        grad_of(params_[k]) = at::Tensor();
    }
    for (; next_ < buckets_.size(); ++next_) start(buckets_[next_]);
    c10::NoGradGuard no_grad;
    for (Bucket& b : buckets_) {
        b.pending.wait();
        int64_t offset = 0;
        for (size_t k : b.members) {
            const at::Tensor& p = params_[k];
            grad_of(p) =
                keep(b.tag) ? b.flat.narrow(0, offset, p.numel()).view_as(p) : at::Tensor();
            offset += p.numel();
        }
    }
    if (!late.empty()) {
        log_debug("ddp: {} gradients completed twice in one backward pass; reduced apart",
                  late.size());
        for (size_t j = 0; j < late.size(); ++j) {
            const Bucket& b = buckets_[bucket_of_[late[j]]];
            start_(late_grads[j], b.tag).wait();
            at::Tensor& g = grad_of(params_[late[j]]);
            if (g.defined()) g.add_(late_grads[j]);
        }
    }
    reset();  // the gradients are views of the buckets' tensors now
}

}  // namespace sf::distributed
