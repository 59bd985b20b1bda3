// LinearPipeline: every item arrives once, the token bound holds, rejections are reported and
// do not stop the run, the source-order sink restores order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
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
using testing::InFlight;
using testing::quiet;
using testing::with_watchdog;

TEST(LinearPipeline, EveryItemArrivesExactlyOnceTransformedByEachStage) {
    constexpr int64_t kItems = 500;
    std::vector<int> seen(kItems, 0);
    std::vector<int64_t> values(kItems, -1);
    LinearPipeline pipeline("exactly_once", 6);
    pipeline.source("count", count_to(kItems), kItems)
        .parallel("double", 4, [](std::any&& x) -> std::any { return as_int(x) * 2; })
        .serial("plus_one", [](std::any&& x) -> std::any { return as_int(x) + 1; })
        .sink("collect",
              [&](std::any&& x) {
                  const int64_t v = as_int(x);
                  const int64_t index = current_item()->index;
                  ++seen[index];
                  values[index] = v;
              })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

    for (int64_t i = 0; i < kItems; ++i) {
        EXPECT_EQ(seen[i], 1) << "item " << i;
        EXPECT_EQ(values[i], 2 * i + 1) << "item " << i;
    }
    EXPECT_EQ(stats.produced, kItems);
    EXPECT_EQ(stats.completed, kItems);
    EXPECT_EQ(stats.rejected, 0);
    EXPECT_EQ(stats.dropped, 0);
    EXPECT_FALSE(stats.cancelled);
    EXPECT_EQ(stats.tokens, 6);
    ASSERT_EQ(stats.stages.size(), 4u);
    EXPECT_EQ(stats.stages[0].name, "count");
    EXPECT_EQ(stats.stages[1].items, kItems);
    EXPECT_EQ(stats.stages[2].items, kItems);
    EXPECT_EQ(stats.stages[3].items, kItems);
}

// A fast source and a slow sink: without the token pool the source would run ahead and fill
// the stage queues with every item.
TEST(LinearPipeline, ItemsInFlightNeverExceedTheTokenBound) {
    constexpr int kTokens = 4;
    constexpr int64_t kItems = 120;
    InFlight in_flight;
    std::atomic<int64_t> next{0};
    int64_t sunk = 0, rejected = 0;
    LinearPipeline pipeline("bounded", kTokens);
    pipeline
        .source(
            "fast",
            [&](std::any& out) {
                if (next >= kItems) return false;
                in_flight.enter();
                out = next++;
                return true;
            },
            kItems)
        .parallel("cpu", 8,
                  [](std::any&& x) -> std::any {
                      if (as_int(x) % 5 == 4) throw Reject("every fifth");
                      return std::move(x);
                  })
        .sink("slow",
              [&](std::any&&) {
                  std::this_thread::sleep_for(1ms);
                  ++sunk;
                  in_flight.leave();
              })
        .on_reject([&](const RejectInfo&) {
            ++rejected;
            in_flight.leave();
        })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

    EXPECT_LE(in_flight.max.load(), kTokens);
    // The sink is the bottleneck, so the pool is used in full: the bound is what limits.
    EXPECT_EQ(in_flight.max.load(), kTokens);
    EXPECT_LE(stats.max_in_flight_observed, kTokens);
    EXPECT_EQ(in_flight.now.load(), 0);
    EXPECT_EQ(sunk + rejected, kItems);
    EXPECT_EQ(rejected, kItems / 5);
}

TEST(LinearPipeline, BoundHoldsWithABatchStageAndASourceOrderSink) {
    constexpr int kTokens = 6;
    constexpr int64_t kItems = 80;
    InFlight in_flight;
    std::atomic<int64_t> next{0};
    std::vector<int64_t> order;
    LinearPipeline pipeline("bounded_batch", kTokens);
    pipeline
        .source("fast",
                [&](std::any& out) {
                    if (next >= kItems) return false;
                    in_flight.enter();
                    out = next++;
                    return true;
                })
        .parallel("jitter", 4,
                  [](std::any&& x) -> std::any {
                      std::this_thread::sleep_for(std::chrono::microseconds(100 * (as_int(x) % 4)));
                      return std::move(x);
                  })
        .serial_batched("batch", 4, [](std::vector<std::any>&& xs) { return std::move(xs); })
        .sink(
            "ordered",
            [&](std::any&& x) {
                order.push_back(as_int(x));
                in_flight.leave();
            },
            SinkOrder::kSource)
        .progress(quiet());
    with_watchdog(10s, [&] { return pipeline.run(); });

    EXPECT_LE(in_flight.max.load(), kTokens);
    ASSERT_EQ(order.size(), static_cast<size_t>(kItems));
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
}

TEST(LinearPipeline, RejectionsAreReportedWithTheirLabelAndTheRunContinues) {
    constexpr int64_t kItems = 70;
    std::vector<RejectInfo> rejects;
    std::vector<int64_t> sunk;
    LinearPipeline pipeline("rejects", 4);
    pipeline.source("list", count_to(kItems), kItems)
        .describe([](const std::any& x) { return "file_" + std::to_string(as_int(x)) + ".png"; })
        .parallel("decode", 3,
                  [](std::any&& x) -> std::any {
                      if (as_int(x) % 7 == 0) throw Reject("truncated image");
                      return std::move(x);
                  })
        .sink("write",
              [&](std::any&& x) {
                  if (as_int(x) == 13) throw Reject("caption missing");
                  sunk.push_back(as_int(x));
              })
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

    EXPECT_EQ(stats.rejected, 11);  // 0, 7, ..., 63 and 13
    EXPECT_EQ(stats.completed, kItems - 11);
    EXPECT_EQ(static_cast<int64_t>(sunk.size()), stats.completed);
    EXPECT_FALSE(stats.cancelled);
    ASSERT_EQ(rejects.size(), 11u);
    for (const RejectInfo& r : rejects) {
        EXPECT_EQ(r.label, "file_" + std::to_string(r.index) + ".png");
        if (r.index == 13) {
            EXPECT_EQ(r.stage, "write");
            EXPECT_EQ(r.reason, "caption missing");
        } else {
            EXPECT_EQ(r.index % 7, 0);
            EXPECT_EQ(r.stage, "decode");
            EXPECT_EQ(r.reason, "truncated image");
        }
    }
    EXPECT_EQ(stats.stages[1].rejects, 10);
    EXPECT_EQ(stats.stages[2].rejects, 1);
}

TEST(LinearPipeline, SourceMayRejectAnItemItCannotProduce) {
    auto next = std::make_shared<int64_t>(0);
    std::vector<RejectInfo> rejects;
    int64_t sunk = 0;
    LinearPipeline pipeline("source_reject", 2);
    pipeline
        .source("list",
                [next](std::any& out) {
                    if (*next >= 10) return false;
                    if ((*next)++ == 3) throw Reject("unreadable directory entry");
                    out = *next;
                    return true;
                })
        .sink("write", [&](std::any&&) { ++sunk; })
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    RunStats stats = pipeline.run();
    EXPECT_EQ(stats.produced, 10);
    EXPECT_EQ(sunk, 9);
    ASSERT_EQ(rejects.size(), 1u);
    EXPECT_EQ(rejects[0].index, 3);
    EXPECT_EQ(rejects[0].stage, "list");
}

TEST(LinearPipeline, SourceOrderSinkRestoresOrderAroundRejections) {
    constexpr int64_t kItems = 200;
    std::vector<int64_t> order;
    LinearPipeline pipeline("ordered", 8);
    pipeline.source("count", count_to(kItems), kItems)
        .parallel("jitter", 4,
                  [](std::any&& x) -> std::any {
                      const int64_t v = as_int(x);
                      // Early items take longest, so later ones overtake them.
                      std::this_thread::sleep_for(std::chrono::microseconds(50 * (7 - v % 8)));
                      if (v % 10 == 3) throw Reject("odd one out");
                      return std::move(x);
                  })
        .sink(
            "write", [&](std::any&& x) { order.push_back(as_int(x)); }, SinkOrder::kSource)
        .progress(quiet());
    with_watchdog(10s, [&] { return pipeline.run(); });

    ASSERT_EQ(order.size(), static_cast<size_t>(kItems - kItems / 10));
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    EXPECT_EQ(std::count_if(order.begin(), order.end(), [](int64_t v) { return v % 10 == 3; }), 0);
}

TEST(LinearPipeline, EmptySourceRunsNothing) {
    int calls = 0;
    LinearPipeline pipeline("empty", 3);
    pipeline
        .source("none",
                [&](std::any&) {
                    ++calls;
                    return false;
                })
        .serial("never", [](std::any&& x) -> std::any { return std::move(x); })
        .sink("never", [](std::any&&) { FAIL() << "sink called"; })
        .progress(quiet());
    RunStats stats = pipeline.run();
    EXPECT_EQ(calls, 1);  // not asked again once exhausted
    EXPECT_EQ(stats.produced, 0);
    EXPECT_EQ(stats.completed, 0);
}

TEST(LinearPipeline, StageBodySeesItsItemContext) {
    std::atomic<int> mismatches{0};
    LinearPipeline pipeline("context", 4);
    pipeline.source("count", count_to(50))
        .describe([](const std::any& x) { return "item" + std::to_string(as_int(x)); })
        .parallel("check", 2,
                  [&](std::any&& x) -> std::any {
                      const ItemContext* item = current_item();
                      if (item == nullptr || item->index != as_int(x) ||
                          item->label != "item" + std::to_string(as_int(x)) ||
                          item->cancel != &pipeline.cancel_token()) {
                          ++mismatches;
                      }
                      return std::move(x);
                  })
        .sink("drop", [](std::any&&) {})
        .progress(quiet());
    pipeline.run();
    EXPECT_EQ(mismatches.load(), 0);
    EXPECT_EQ(current_item(), nullptr);
}

TEST(LinearPipeline, PlanNamesEveryStageAndTheBound) {
    LinearPipeline pipeline("prep", 4);
    pipeline.source("list", count_to(1))
        .parallel("decode", 3, [](std::any&& x) { return std::move(x); })
        .serial_batched("encode_vae", 2, [](std::vector<std::any>&& xs) { return std::move(xs); })
        .sink(
            "write", [](std::any&&) {}, SinkOrder::kSource);
    const std::string plan = pipeline.plan();
    EXPECT_NE(plan.find("pipeline prep: at most 4 items in flight"), std::string::npos) << plan;
    EXPECT_NE(plan.find("decode"), std::string::npos) << plan;
    EXPECT_NE(plan.find("x3"), std::string::npos) << plan;
    EXPECT_NE(plan.find("batch 2"), std::string::npos) << plan;
    EXPECT_NE(plan.find("source order"), std::string::npos) << plan;
}

TEST(LinearPipeline, IncompleteOrMisorderedPipelinesAreRejectedWhenBuilt) {
    auto pass = [](std::any&& x) { return std::move(x); };
    auto is_invalid_argument = [](const Error& e) {
        return e.code() == ErrorCode::kInvalidArgument;
    };
    EXPECT_THROW(LinearPipeline("zero", 0), Error);
    {
        LinearPipeline p("no_source", 2);
        EXPECT_THROW(p.serial("s", pass), Error);
    }
    {
        LinearPipeline p("bad_concurrency", 2);
        p.source("src", count_to(1));
        EXPECT_THROW(p.parallel("p", 0, pass), Error);
        EXPECT_THROW(p.source("again", count_to(1)), Error);
    }
    {
        LinearPipeline p("no_sink", 2);
        p.source("src", count_to(1)).serial("s", pass);
        try {
            p.run();
            FAIL() << "run() without a sink";
        } catch (const Error& e) {
            EXPECT_TRUE(is_invalid_argument(e)) << e.what();
        }
    }
    {
        LinearPipeline p("after_sink", 2);
        p.source("src", count_to(1)).sink("out", [](std::any&&) {});
        EXPECT_THROW(p.serial("late", pass), Error);
    }
}

}  // namespace
}  // namespace sf::graph
