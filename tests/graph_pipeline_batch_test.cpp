// LinearPipeline::serial_batched: full batches while input flows, one partial batch at the end,
// no stall when every token waits (source-order sink, chained batch stages), per-batch rejection.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "core/error.h"
#include "graph/pipeline.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace sf::graph {
namespace {

using namespace std::chrono_literals;
using testing::as_int;
using testing::count_to;
using testing::quiet;
using testing::with_watchdog;

// Returns each input times ten, recording the batch size.
LinearPipeline::BatchFn times_ten(std::vector<size_t>& sizes) {
    return [&sizes](std::vector<std::any>&& xs) {
        sizes.push_back(xs.size());
        std::vector<std::any> out;
        for (const std::any& x : xs) out.emplace_back(as_int(x) * 10);
        return out;
    };
}

TEST(LinearPipelineBatch, FullBatchesThenOnePartialBatchAtTheEnd) {
    std::vector<size_t> sizes;
    std::vector<int64_t> values;
    LinearPipeline pipeline("batches", 8);
    pipeline.source("count", count_to(23))
        .parallel("prep", 2, [](std::any&& x) { return std::move(x); })
        .serial_batched("vae", 4, times_ten(sizes))
        .sink("write", [&](std::any&& x) { values.push_back(as_int(x)); })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

    EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 4, 4, 4, 3}));
    std::sort(values.begin(), values.end());
    ASSERT_EQ(values.size(), 23u);
    for (int64_t i = 0; i < 23; ++i) EXPECT_EQ(values[i], 10 * i);
    EXPECT_EQ(stats.stages[2].items, 23);
}

// In source order, batches are consecutive indices whatever the timing (later items overtake
// earlier ones in the parallel stage), and a rejected item leaves a hole in its batch.
TEST(LinearPipelineBatch, SourceOrderCutsTheSameBatchesWhateverTheTiming) {
    for (int run = 0; run < 3; ++run) {
        std::vector<std::vector<int64_t>> batches;
        LinearPipeline pipeline("ordered", 6);
        pipeline.source("count", count_to(14))
            .parallel(
                "prep", 3,
                [run](std::any&& x) -> std::any {
                    const int64_t i = as_int(x);
                    if (i == 5) throw Reject("item 5 is bad");
                    std::this_thread::sleep_for(std::chrono::milliseconds((i * 7 + run * 3) % 5));
                    return std::move(x);
                })
            .serial_batched(
                "vae", 3,
                [&](std::vector<std::any>&& xs) {
                    std::vector<int64_t> batch;
                    for (const auto& x : xs) batch.push_back(as_int(x));
                    batches.push_back(batch);
                    return std::move(xs);
                },
                ItemOrder::kSource)
            .sink("write", [](std::any&&) {})
            .progress(quiet());
        const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
        EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{
                               {0, 1, 2}, {3, 4, 6}, {7, 8, 9}, {10, 11, 12}, {13}}))
            << "run " << run;
        EXPECT_EQ(stats.completed, 13);
        EXPECT_EQ(stats.rejected, 1);
    }
}

// 5 tokens, batches of 4, and item 0 slow: items 1..4 fill the first batch and then wait in the
// source-order sink for item 0, which is alone in the next batch with no token left to fill it.
TEST(LinearPipelineBatch, PartialBatchRunsWhenEveryTokenWaits) {
    for (int tokens : {4, 5, 7}) {
        std::vector<size_t> sizes;
        std::vector<int64_t> order;
        LinearPipeline pipeline("stall", tokens);
        pipeline.source("count", count_to(40))
            .parallel("prep", 4,
                      [](std::any&& x) -> std::any {
                          if (as_int(x) % 10 == 0) std::this_thread::sleep_for(20ms);
                          return std::move(x);
                      })
            .serial_batched("vae", 4, times_ten(sizes))
            .sink(
                "write", [&](std::any&& x) { order.push_back(as_int(x)); }, SinkOrder::kSource)
            .progress(quiet());
        with_watchdog(10s, [&] { return pipeline.run(); });

        ASSERT_EQ(order.size(), 40u) << tokens << " tokens";
        for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(order[i], 10 * i) << tokens << " tokens";
        for (size_t size : sizes) EXPECT_LE(size, 4u);
    }
}

// Two batch stages can each hold tokens the other needs: 4 tokens, batches of 3.
TEST(LinearPipelineBatch, ChainedBatchStagesDoNotStall) {
    std::vector<size_t> first, second;
    int64_t written = 0;
    LinearPipeline pipeline("two_batches", 4);
    pipeline.source("count", count_to(31))
        .serial_batched("a", 3, times_ten(first))
        .parallel("mid", 2, [](std::any&& x) { return std::move(x); })
        .serial_batched("b", 3, times_ten(second))
        .sink("write", [&](std::any&&) { ++written; })
        .progress(quiet());
    with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_EQ(written, 31);
    size_t total_first = 0, total_second = 0;
    for (size_t s : first) total_first += s;
    for (size_t s : second) total_second += s;
    EXPECT_EQ(total_first, 31u);
    EXPECT_EQ(total_second, 31u);
}

TEST(LinearPipelineBatch, RejectFromABatchRejectsEachOfItsItems) {
    std::vector<RejectInfo> rejects;
    int batch = 0;
    LinearPipeline pipeline("batch_reject", 4);
    pipeline.source("count", count_to(12))
        .describe([](const std::any& x) { return std::to_string(as_int(x)); })
        .serial_batched("vae", 4,
                        [&](std::vector<std::any>&& xs) {
                            if (++batch == 2) throw Reject("NaN in latents");
                            return std::move(xs);
                        })
        .sink(
            "write", [](std::any&&) {}, SinkOrder::kSource)
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_EQ(stats.rejected, 4);
    EXPECT_EQ(stats.completed, 8);
    ASSERT_EQ(rejects.size(), 4u);
    for (const RejectInfo& r : rejects) {
        EXPECT_EQ(r.stage, "vae");
        EXPECT_EQ(r.reason, "NaN in latents");
        EXPECT_EQ(r.label, std::to_string(r.index));
    }
}

TEST(LinearPipelineBatch, WrongNumberOfOutputsIsFatal) {
    LinearPipeline pipeline("bad_batch", 4);
    pipeline.source("count", count_to(8))
        .serial_batched("vae", 2,
                        [](std::vector<std::any>&& xs) {
                            xs.pop_back();
                            return std::move(xs);
                        })
        .sink("write", [](std::any&&) {})
        .progress(quiet());
    sf::test::expect_error([&] { with_watchdog(10s, [&] { return pipeline.run(); }); },
                           ErrorCode::kInvalidArgument, "returned 1 outputs for 2 inputs");
}

TEST(LinearPipelineBatch, BatchLargerThanTheTokenPoolIsRefusedWhenBuilt) {
    LinearPipeline pipeline("too_big", 3);
    pipeline.source("count", count_to(8));
    sf::test::expect_error(
        [&] {
            pipeline.serial_batched("vae", 4,
                                    [](std::vector<std::any>&& xs) { return std::move(xs); });
        },
        ErrorCode::kInvalidArgument, "max_in_flight = 3");
}

}  // namespace
}  // namespace sf::graph
