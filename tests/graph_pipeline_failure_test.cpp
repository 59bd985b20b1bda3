// LinearPipeline failure handling: a fatal exception cancels the run without hanging, comes back
// to the caller with its type, and leaves every item the sink accepted accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "graph/pipeline.h"
#include "graph_test_util.h"

namespace sf::graph {
namespace {

using namespace std::chrono_literals;
using testing::as_int;
using testing::count_to;
using testing::DiskFull;
using testing::expect_disk_full;
using testing::quiet;
using testing::with_watchdog;

// Without one-to-many stages: every produced item ended once.
void expect_each_item_ended(const RunStats& stats) {
    EXPECT_EQ(stats.produced, stats.completed + stats.rejected + stats.dropped);
}

TEST(LinearPipelineFailure, ThrowingStageCancelsRethrowsItsTypeAndKeepsCommittedItems) {
    constexpr int64_t kItems = 100000;
    constexpr int kTokens = 4;
    std::vector<int64_t> committed;
    int64_t next = 0;
    int calls_after_cancel = 0;
    LinearPipeline pipeline("fatal", kTokens);
    pipeline
        .source(
            "count",
            [&](std::any& out) {
                if (pipeline.cancel_token().cancelled()) ++calls_after_cancel;
                out = next;
                return ++next <= kItems;
            },
            kItems)
        .parallel("decode", 2,
                  [](std::any&& x) -> std::any {
                      if (as_int(x) == 40) throw DiskFull("no space left on device");
                      return std::move(x);
                  })
        .serial("encode", [](std::any&& x) { return std::move(x); })
        .sink("write", [&](std::any&& x) { committed.push_back(as_int(x)); })
        .progress(quiet());

    expect_disk_full(pipeline);
    if (::testing::Test::HasFailure()) return;

    const RunStats& stats = pipeline.stats();
    EXPECT_TRUE(stats.cancelled);
    expect_each_item_ended(stats);
    // Committed: everything the sink accepted, each once, and never the failed item.
    EXPECT_EQ(static_cast<int64_t>(committed.size()), stats.completed);
    std::set<int64_t> unique(committed.begin(), committed.end());
    EXPECT_EQ(unique.size(), committed.size());
    EXPECT_EQ(unique.count(40), 0u);
    // Item 40 got a token, so at most kTokens - 1 of the 40 before it were still in flight (and
    // may have been dropped).
    EXPECT_GE(stats.completed, 40 - (kTokens - 1));
    // The source stops at once: at most the one call already under way when the stage failed.
    // (How many items overtake item 40 before its task runs is up to TBB's scheduler, which is
    // not FIFO, so there is no fixed bound on `produced` itself.)
    EXPECT_LE(calls_after_cancel, 1);
    EXPECT_LT(stats.produced, kItems);
    EXPECT_TRUE(pipeline.cancel_token().cancelled());
}

TEST(LinearPipelineFailure, SinkErrorKeepsItsCategoryAndStopsTheSource) {
    std::vector<int64_t> committed;
    LinearPipeline pipeline("sink_fails", 3);
    pipeline.source("count", count_to(1000))
        .sink(
            "write",
            [&](std::any&& x) {
                if (as_int(x) == 10) throw Error::IOError("/cache/data.mdb: disk full");
                committed.push_back(as_int(x));
            },
            SinkOrder::kSource)
        .progress(quiet());
    try {
        with_watchdog(10s, [&] { return pipeline.run(); });
        FAIL() << "no exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kIOError);
    }
    // In source order, items 0..9 are exactly the ones written before the failure.
    std::vector<int64_t> expected(10);
    for (int64_t i = 0; i < 10; ++i) expected[i] = i;
    EXPECT_EQ(committed, expected);
    EXPECT_LE(pipeline.stats().produced, 10 + 3);
    expect_each_item_ended(pipeline.stats());
}

// Items wait in a slow stage (one running, the rest queued behind it) when another stage fails:
// the running one sees the cancel token and stops early, the queued ones are dropped unrun.
TEST(LinearPipelineFailure, FatalErrorWhileItemsBlockInASlowStageStillTerminates) {
    if (testing::usable_cpus() < 2) GTEST_SKIP() << "needs two threads";
    // The waits below are bounded only as a safety net (a loaded machine may take long to
    // schedule a thread); what the test asserts is what ended the slow stage, not how fast.
    constexpr auto kSafety = 60s;
    std::atomic<int> slow_runs{0};
    std::atomic<bool> slow_saw_cancel{false};
    auto next = std::make_shared<int64_t>(0);
    LinearPipeline pipeline("blocked", 8);
    pipeline
        .source("count",
                [&, next](std::any& out) {
                    if (*next == 3) {
                        // Fail only once item 0 is inside the slow stage.
                        const auto deadline = std::chrono::steady_clock::now() + kSafety;
                        while (slow_runs == 0 && std::chrono::steady_clock::now() < deadline) {
                            std::this_thread::sleep_for(1ms);
                        }
                        throw std::out_of_range("listing failed");
                    }
                    out = (*next)++;
                    return true;
                })
        .serial("slow",
                [&](std::any&& x) -> std::any {
                    ++slow_runs;
                    const auto deadline = std::chrono::steady_clock::now() + kSafety;
                    while (!current_item()->cancel->cancelled() &&
                           std::chrono::steady_clock::now() < deadline) {
                        std::this_thread::sleep_for(1ms);
                    }
                    slow_saw_cancel = current_item()->cancel->cancelled();
                    current_item()->cancel->throw_if_cancelled("slow stage");
                    return std::move(x);
                })
        .sink("write", [](std::any&&) { FAIL() << "nothing should be written"; })
        .progress(quiet());

    EXPECT_THROW(with_watchdog(3 * kSafety, [&] { return pipeline.run(); }), std::out_of_range);
    EXPECT_TRUE(slow_saw_cancel) << "the running item ran to its end instead of seeing the cancel";
    const RunStats& stats = pipeline.stats();
    EXPECT_EQ(stats.produced, 3);
    EXPECT_EQ(stats.dropped, 3);
    EXPECT_EQ(stats.completed, 0);
    EXPECT_EQ(slow_runs.load(), 1);  // the queued items were dropped unrun
}

TEST(LinearPipelineFailure, FirstOfSeveralErrorsIsTheOneReported) {
    LinearPipeline pipeline("many_errors", 8);
    pipeline.source("count", count_to(1000))
        .parallel("flaky", 4,
                  [](std::any&& x) -> std::any {
                      if (as_int(x) >= 20) {
                          throw std::runtime_error("item " + std::to_string(as_int(x)));
                      }
                      return std::move(x);
                  })
        .sink("write", [](std::any&&) {})
        .progress(quiet());
    try {
        with_watchdog(10s, [&] { return pipeline.run(); });
        FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("item ", 0), 0u) << e.what();
    }
    expect_each_item_ended(pipeline.stats());
}

TEST(LinearPipelineFailure, FailingBatchDropsItsItemsAndPartialBatchesAreAccountedFor) {
    LinearPipeline pipeline("batch_fails", 8);
    int batches = 0;
    pipeline.source("count", count_to(1000))
        .serial_batched("vae", 4,
                        [&](std::vector<std::any>&& xs) {
                            if (++batches == 3) throw Error::OutOfMemory("cuda: 2 GiB requested");
                            return std::move(xs);
                        })
        .sink(
            "write", [](std::any&&) {}, SinkOrder::kSource)
        .progress(quiet());
    try {
        with_watchdog(10s, [&] { return pipeline.run(); });
        FAIL() << "no exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    }
    // Batches 1 and 2 passed; the sink had finished at least batch 1, whose tokens batch 3
    // needed to fill. What it had not written when batch 3 failed is dropped, not written.
    EXPECT_GE(pipeline.stats().completed, 4);
    EXPECT_LE(pipeline.stats().completed, 8);
    expect_each_item_ended(pipeline.stats());
}

TEST(LinearPipelineFailure, CancelFromOutsideStopsTheRunWithoutAnError) {
    constexpr int64_t kItems = 100000;
    LinearPipeline pipeline("interrupted", 4);
    int64_t written = 0;
    pipeline.source("count", count_to(kItems))
        .parallel("work", 2, [](std::any&& x) { return std::move(x); })
        .sink("write",
              [&](std::any&&) {
                  // Stands in for a SIGINT watcher thread calling cancel().
                  if (++written == 10) pipeline.cancel();
              })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_TRUE(stats.cancelled);
    EXPECT_EQ(stats.completed, 10);
    EXPECT_LT(stats.produced, kItems);
    expect_each_item_ended(stats);
}

TEST(LinearPipelineFailure, ExceptionFromOnRejectIsFatal) {
    LinearPipeline pipeline("reject_handler_fails", 2);
    pipeline.source("count", count_to(100))
        .serial("check", [](std::any&&) -> std::any { throw Reject("bad"); })
        .sink("write", [](std::any&&) {})
        .on_reject([](const RejectInfo&) { throw Error::IOError("reject list not writable"); })
        .progress(quiet());
    EXPECT_THROW(with_watchdog(10s, [&] { return pipeline.run(); }), Error);
    EXPECT_GE(pipeline.stats().rejected, 1);
    EXPECT_LE(pipeline.stats().produced, 2);  // the failing item and the other token's
    expect_each_item_ended(pipeline.stats());
}

}  // namespace
}  // namespace sf::graph
