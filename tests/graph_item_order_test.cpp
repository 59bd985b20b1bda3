// The ordering code behind the source-order stages (graph/item_order.h, internal to graph/):
// consecutive release with holes, and batch cutting that depends on positions, not arrival.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "graph/item_order.h"

namespace sf::graph::detail {
namespace {

using Item = std::shared_ptr<int64_t>;

Item item(int64_t value) { return std::make_shared<int64_t>(value); }

std::vector<int64_t> values(const std::vector<Item>& items) {
    std::vector<int64_t> out;
    for (const Item& i : items) out.push_back(*i);
    return out;
}

TEST(ConsecutiveOrder, ReleasesByPositionPassingOverHoles) {
    ConsecutiveOrder<Item> order;
    Item out;
    order.put(2, item(20));
    order.put(1, nullptr);  // a hole
    EXPECT_FALSE(order.pop(out)) << "position 0 has not arrived";
    EXPECT_EQ(order.held(), 1u);
    order.put(0, item(0));
    std::vector<int64_t> released;
    while (order.pop(out)) released.push_back(*out);
    EXPECT_EQ(released, (std::vector<int64_t>{0, 20}));
    EXPECT_EQ(order.next(), 3);
    EXPECT_TRUE(order.empty());
    EXPECT_EQ(order.held(), 0u);
}

TEST(ConsecutiveOrder, TakeAllReturnsWhatWaitsInPositionOrder) {
    ConsecutiveOrder<Item> order;
    order.put(5, item(5));
    order.put(3, nullptr);
    order.put(4, item(4));
    EXPECT_EQ(values(order.take_all()), (std::vector<int64_t>{4, 5}));
    EXPECT_TRUE(order.empty());
    EXPECT_EQ(order.held(), 0u);
}

// Whatever order 40 positions arrive in (a few of them holes), the batches are the positions cut
// into consecutive groups of 3, holes left out, and only the last is partial: cut at the stall.
TEST(BatchCutter, SourceOrderBatchesDependOnPositionsNotOnArrival) {
    constexpr int64_t kPositions = 40;
    auto is_hole = [](int64_t p) { return p % 7 == 3; };
    std::vector<std::vector<int64_t>> expected(1);
    for (int64_t p = 0; p < kPositions; ++p) {
        if (is_hole(p)) continue;
        if (expected.back().size() == 3) expected.emplace_back();
        expected.back().push_back(p);
    }
    std::vector<int64_t> arrival(kPositions);
    std::iota(arrival.begin(), arrival.end(), 0);
    std::mt19937 rng(7);
    for (int trial = 0; trial < 20; ++trial) {
        std::shuffle(arrival.begin(), arrival.end(), rng);
        BatchCutter<Item> cutter(3, ItemOrder::kSource);
        std::vector<std::vector<int64_t>> batches;
        for (int64_t p : arrival) {
            if (is_hole(p)) {
                cutter.skip(p);
            } else {
                cutter.add(p, item(p));
            }
            for (auto batch = cutter.cut(false); !batch.empty(); batch = cutter.cut(false)) {
                batches.push_back(values(batch));
            }
        }
        const std::vector<Item> last = cutter.cut(true);
        if (!last.empty()) batches.push_back(values(last));
        EXPECT_EQ(batches, expected) << "trial " << trial;
        EXPECT_TRUE(cutter.empty());
    }
}

TEST(BatchCutter, PartialBatchOnlyWhenStalled) {
    BatchCutter<Item> cutter(4, ItemOrder::kSource);
    cutter.add(1, item(1));
    cutter.add(0, item(0));
    cutter.add(3, item(3));  // waits for position 2
    EXPECT_TRUE(cutter.cut(false).empty());
    EXPECT_EQ(cutter.held(), 3u);
    // A stall cuts what is consecutive; position 3 still waits for its turn.
    EXPECT_EQ(values(cutter.cut(true)), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(cutter.held(), 1u);
    EXPECT_TRUE(cutter.cut(true).empty());
    cutter.skip(2);
    EXPECT_EQ(values(cutter.cut(true)), (std::vector<int64_t>{3}));
    EXPECT_TRUE(cutter.empty());
}

TEST(BatchCutter, ArrivalOrderBatchesTheFirstToArrive) {
    BatchCutter<Item> cutter(2, ItemOrder::kArrival);
    cutter.add(9, item(9));
    cutter.skip(4);  // nothing to wait for in arrival order
    EXPECT_TRUE(cutter.cut(false).empty());
    cutter.add(2, item(2));
    EXPECT_EQ(values(cutter.cut(false)), (std::vector<int64_t>{9, 2}));
    cutter.add(5, item(5));
    EXPECT_EQ(values(cutter.take_all()), (std::vector<int64_t>{5}));
    EXPECT_TRUE(cutter.empty());
}

}  // namespace
}  // namespace sf::graph::detail
