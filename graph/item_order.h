// Internal to graph/: putting items back in order and cutting batches. A source-order batch stage,
// a source-order sink and the expand stage receive items in whatever order the parallel stages
// before them finish them, and pass them on by consecutive position (Msg::order: the source index
// before the expand stage, the expand stage's (source index, sub index) sequence after it). An
// item rejected or dropped on the way still arrives, as a hole that holds its position, so a
// position is never waited for in vain. TBB- and Msg-free, so that it is tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "core/check.h"
#include "graph/pipeline.h"

namespace sf::graph::detail {

// Releases values in consecutive positions 0, 1, 2, ... whatever the order they arrive in. T is a
// nullable handle (a shared_ptr); a null one is a hole: its position must pass before the next
// one can, but it carries nothing to release.
template <typename T>
class ConsecutiveOrder {
public:
    void put(int64_t position, T value) {
        SF_CHECK(position >= next_, "item order: a position arrived after its turn");
        const bool held = static_cast<bool>(value);
        const bool fresh = waiting_.emplace(position, std::move(value)).second;
        SF_CHECK(fresh, "item order: a position arrived twice");
        if (held) ++held_;
    }

    // Moves the next value whose turn has come into `out`, passing over holes; false when the next
    // position has not arrived.
    bool pop(T& out) {
        while (!waiting_.empty() && waiting_.begin()->first == next_) {
            auto node = waiting_.extract(waiting_.begin());
            ++next_;
            if (node.mapped()) {
                --held_;
                out = std::move(node.mapped());
                return true;
            }
        }
        return false;
    }

    // Everything waiting, in position order, holes left out; the order itself is abandoned (this
    // is for a cancelled run, which passes items on as they come).
    std::vector<T> take_all() {
        std::vector<T> values;
        for (auto& [position, value] : waiting_) {
            if (value) values.push_back(std::move(value));
        }
        waiting_.clear();
        held_ = 0;
        return values;
    }

    int64_t next() const { return next_; }  // the position whose turn it is
    size_t held() const { return held_; }   // values waiting, holes not counted
    bool empty() const { return waiting_.empty(); }

private:
    std::map<int64_t, T> waiting_;
    int64_t next_ = 0;
    size_t held_ = 0;
};

// Groups a batch stage's items into batches of `batch_size`. In arrival order a batch is the next
// batch_size items to arrive; in source order it is the next batch_size items by position, holes
// passed over, so which items share a batch depends on the positions alone. A partial batch is
// cut only when the caller says the graph is stalled (no token can move before one of the items
// held here does): at the end of input, that is the last batch, whatever the timing.
template <typename T>
class BatchCutter {
public:
    BatchCutter(size_t batch_size, ItemOrder order) : batch_size_(batch_size), order_(order) {
        SF_CHECK(batch_size >= 1, "batch cutter: batch size 0");
    }

    void add(int64_t position, T item) {
        SF_CHECK(item, "batch cutter: a null item");
        if (order_ == ItemOrder::kSource) {
            in_order_.put(position, std::move(item));
        } else {
            pending_.push_back(std::move(item));
        }
    }
    // A position that carries no item (rejected or dropped before this stage).
    void skip(int64_t position) {
        if (order_ == ItemOrder::kSource) in_order_.put(position, T());
    }

    // The next batch to run, or an empty vector: a full batch when there is one, else, when
    // `stalled`, whatever is pending.
    std::vector<T> cut(bool stalled) {
        T item;
        while (pending_.size() < batch_size_ && in_order_.pop(item)) {
            pending_.push_back(std::move(item));
        }
        std::vector<T> batch;
        if (pending_.size() >= batch_size_) {
            const auto end = pending_.begin() + static_cast<std::ptrdiff_t>(batch_size_);
            batch.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(end));
            pending_.erase(pending_.begin(), end);
        } else if (stalled) {
            batch.swap(pending_);
        }
        return batch;
    }

    // Everything held, for a cancelled run.
    std::vector<T> take_all() {
        std::vector<T> items;
        items.swap(pending_);
        for (T& item : in_order_.take_all()) items.push_back(std::move(item));
        return items;
    }

    size_t held() const { return pending_.size() + in_order_.held(); }
    bool empty() const { return pending_.empty() && in_order_.empty(); }

private:
    const size_t batch_size_;
    const ItemOrder order_;
    std::vector<T> pending_;        // the batch being filled
    ConsecutiveOrder<T> in_order_;  // source order: items waiting for earlier positions
};

}  // namespace sf::graph::detail
