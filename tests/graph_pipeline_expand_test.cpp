// LinearPipeline::expand: one item becomes zero or more outputs, each holding a token of the second
// pool, so the outputs in flight stay within the bound whatever the number per item; they go on in
// (source index, sub index) order, so source-order batches after the expand stage are the same
// whatever the timing; rejection, failure and cancellation mid-expansion.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "graph/pipeline.h"
#include "graph_test_util.h"
#include "test_util.h"

namespace sf::graph {
namespace {

using namespace std::chrono_literals;
using testing::as_int;
using testing::DiskFull;
using testing::expect_disk_full;
using testing::InFlight;
using testing::quiet;
using testing::with_watchdog;

using IndexSub = std::pair<int64_t, int64_t>;
using Batches = std::vector<std::vector<IndexSub>>;

// One source item per entry, whose payload is the number of outputs it expands into.
LinearPipeline::SourceFn items_with_counts(std::vector<int64_t> counts) {
    auto next = std::make_shared<size_t>(0);
    return [next, counts = std::move(counts)](std::any& out) {
        if (*next >= counts.size()) return false;
        out = counts[(*next)++];
        return true;
    };
}

// The value of output `sub` of item `index`, which names both (subs stay below 1000 here).
int64_t value_of(int64_t index, int64_t sub) { return 1000 * index + sub; }
IndexSub index_sub_of(int64_t value) { return {value / 1000, value % 1000}; }

// What the tests' expand stage does with an item (a count n): the outputs value_of(index, 0 ..
// n-1), made one per call of the next function. `hook`, when set, runs before each output is
// made, with its sub index.
LinearPipeline::ExpandFn expand_counts(std::function<void(int64_t index, int64_t sub)> hook = {}) {
    return [hook](std::any&& in) -> LinearPipeline::SourceFn {
        const int64_t n = as_int(in);
        const int64_t index = current_item()->index;
        auto sub = std::make_shared<int64_t>(0);
        return [=](std::any& out) {
            if (*sub >= n) return false;
            if (hook) hook(index, *sub);
            out = value_of(index, (*sub)++);
            return true;
        };
    };
}

// (index, sub) of every output of `counts`, in lexicographic order, but for the items and the
// outputs left out.
std::vector<IndexSub> outputs_of(const std::vector<int64_t>& counts,
                                 const std::vector<int64_t>& items_left_out = {},
                                 const std::vector<IndexSub>& outputs_left_out = {}) {
    std::vector<IndexSub> all;
    for (int64_t i = 0; i < static_cast<int64_t>(counts.size()); ++i) {
        if (std::count(items_left_out.begin(), items_left_out.end(), i)) continue;
        for (int64_t s = 0; s < counts[i]; ++s) {
            if (std::count(outputs_left_out.begin(), outputs_left_out.end(), IndexSub{i, s})) {
                continue;
            }
            all.emplace_back(i, s);
        }
    }
    return all;
}

// `sequence` cut into consecutive batches of `size`, the last one partial.
Batches chunks(const std::vector<IndexSub>& sequence, size_t size) {
    Batches batches;
    for (size_t i = 0; i < sequence.size(); i += size) {
        batches.emplace_back(
            sequence.begin() + static_cast<std::ptrdiff_t>(i),
            sequence.begin() + static_cast<std::ptrdiff_t>(std::min(i + size, sequence.size())));
    }
    return batches;
}

// A sleep of up to `max_us` microseconds that changes from run to run and from item to item.
void jitter(uint64_t run, int64_t index, int64_t sub, int max_us) {
    uint64_t x = run * 0x9E3779B97F4A7C15ull +
                 static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull +
                 static_cast<uint64_t>(sub + 1) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    std::this_thread::sleep_for(std::chrono::microseconds(x % static_cast<uint64_t>(max_us)));
}

// Counts the expansions whose state (a decoder, in video prep) is alive: one is made when an item
// is opened and destroyed with its next function.
struct LiveExpansions {
    std::atomic<int> opened{0};
    std::atomic<int> alive{0};
    LinearPipeline::ExpandFn wrap(LinearPipeline::ExpandFn inner) {
        return [this, inner = std::move(inner)](std::any&& x) -> LinearPipeline::SourceFn {
            struct State {
                explicit State(std::atomic<int>& n) : alive(n) { ++alive; }
                ~State() { --alive; }
                std::atomic<int>& alive;
            };
            auto next = inner(std::move(x));
            ++opened;
            return
                [next, state = std::make_shared<State>(alive)](std::any& out) { return next(out); };
        };
    }
};

void expect_accounted(const RunStats& stats) {
    EXPECT_EQ(stats.produced + stats.outputs,
              stats.expanded + stats.completed + stats.rejected + stats.dropped);
}

TEST(LinearPipelineExpand, OutputsEachTakeATokenSoTheBoundHoldsWhateverTheItemSize) {
    constexpr int kTokens = 4;
    const std::vector<std::vector<int64_t>> cases = {{0, 1, 50},   {50, 1, 0}, {0, 0, 0, 50, 0, 0},
                                                     {1, 0, 0, 1}, {0, 0},     {}};
    for (const std::vector<int64_t>& counts : cases) {
        const std::string name = ::testing::PrintToString(counts);
        InFlight live;  // outputs made and not yet written, counted here rather than by the runtime
        std::vector<std::tuple<int64_t, int64_t, int64_t>> seen;  // index, sub, value
        LinearPipeline pipeline("windows", kTokens);
        pipeline.source("clips", items_with_counts(counts))
            .expand("windows", expand_counts([&](int64_t, int64_t) { live.enter(); }))
            .sink("write",
                  [&](std::any&& x) {
                      std::this_thread::sleep_for(200us);  // slow: the bound is what limits
                      const ItemContext* item = current_item();
                      seen.emplace_back(item->index, item->sub, as_int(x));
                      live.leave();
                  })
            .progress(quiet());
        const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

        std::vector<std::tuple<int64_t, int64_t, int64_t>> expected;
        for (const auto& [i, s] : outputs_of(counts)) expected.emplace_back(i, s, value_of(i, s));
        std::sort(seen.begin(), seen.end());
        EXPECT_EQ(seen, expected) << name;
        const auto items = static_cast<int64_t>(counts.size());
        const auto outputs = static_cast<int64_t>(expected.size());
        EXPECT_EQ(stats.produced, items) << name;
        EXPECT_EQ(stats.expanded, items) << name;
        EXPECT_EQ(stats.outputs, outputs) << name;
        EXPECT_EQ(stats.completed, outputs) << name;
        EXPECT_EQ(stats.rejected, 0) << name;
        EXPECT_EQ(stats.dropped, 0) << name;
        EXPECT_EQ(stats.stages[1].items, items) << name;
        expect_accounted(stats);

        EXPECT_LE(live.max.load(), kTokens) << name;
        EXPECT_LE(stats.max_in_flight_observed, kTokens) << name;
        EXPECT_LE(stats.max_inputs_in_flight_observed, kTokens) << name;
        if (outputs >= kTokens) {
            // The sink is the bottleneck, so the second pool is used in full.
            EXPECT_EQ(live.max.load(), kTokens) << name;
            EXPECT_EQ(stats.max_in_flight_observed, kTokens) << name;
        }
        EXPECT_EQ(live.now.load(), 0) << name;
    }
}

// Stages before and after the expand stage let items overtake each other; the source-order sink
// puts the outputs back in (index, sub) order.
TEST(LinearPipelineExpand, SourceOrderSinkTakesOutputsInIndexSubOrder) {
    const std::vector<int64_t> counts = {3, 0, 7, 1, 0, 12, 2, 0};
    for (uint64_t run = 0; run < 5; ++run) {
        std::vector<IndexSub> order;
        LinearPipeline pipeline("ordered", 4);
        pipeline.source("clips", items_with_counts(counts))
            .parallel("probe", 3,
                      [run](std::any&& x) -> std::any {
                          jitter(run, current_item()->index, -1, 400);
                          return std::move(x);
                      })
            .expand("windows", expand_counts())
            .parallel("augment", 3,
                      [run](std::any&& x) -> std::any {
                          const auto [index, sub] = index_sub_of(as_int(x));
                          jitter(run, index, sub, 400);
                          return std::move(x);
                      })
            .sink(
                "write",
                [&](std::any&& x) {
                    const ItemContext* item = current_item();
                    EXPECT_EQ(index_sub_of(as_int(x)), IndexSub(item->index, item->sub));
                    order.emplace_back(item->index, item->sub);
                },
                SinkOrder::kSource)
            .progress(quiet());
        with_watchdog(10s, [&] { return pipeline.run(); });
        EXPECT_EQ(order, outputs_of(counts)) << "run " << run;
    }
}

// Random sleeps before the expand stage, in its functions and after it; a rejection before it (a
// whole item) and after it (one output) leave holes. Which outputs share a batch is still the
// (index, sub) sequence cut into consecutive batches, in every run, for every pool size.
TEST(LinearPipelineExpand, SourceOrderBatchesAreTheSameWhateverTheTiming) {
    const std::vector<int64_t> counts = {3, 0, 7, 1, 0, 0, 12, 5, 2, 0, 9, 1, 4};
    constexpr int64_t kRejectedItem = 7;
    const IndexSub kRejectedOutput{6, 4};
    const std::vector<IndexSub> sequence = outputs_of(counts, {kRejectedItem}, {kRejectedOutput});
    const std::vector<std::pair<int, int>> shapes = {{4, 3}, {4, 4}, {2, 2}, {3, 1}, {6, 4}};
    for (const auto& [tokens, batch_size] : shapes) {
        const Batches expected = chunks(sequence, static_cast<size_t>(batch_size));
        for (uint64_t run = 0; run < 12; ++run) {
            const std::string name = "tokens " + std::to_string(tokens) + ", batch " +
                                     std::to_string(batch_size) + ", run " + std::to_string(run);
            Batches batches;
            std::vector<IndexSub> written;
            std::vector<RejectInfo> rejects;
            LinearPipeline pipeline("deterministic", tokens);
            pipeline.source("clips", items_with_counts(counts))
                .parallel("probe", 3,
                          [run](std::any&& x) -> std::any {
                              const int64_t index = current_item()->index;
                              jitter(run, index, -1, 300);
                              if (index == kRejectedItem) throw Reject("no video stream");
                              return std::move(x);
                          })
                .expand("windows",
                        [run, inner = expand_counts([run](int64_t index, int64_t sub) {
                                  jitter(run, index, sub, 150);
                              })](std::any&& x) {
                            jitter(run, current_item()->index, -1, 300);
                            return inner(std::move(x));
                        })
                .parallel("augment", 3,
                          [run, kRejectedOutput](std::any&& x) -> std::any {
                              const IndexSub at = index_sub_of(as_int(x));
                              jitter(run, at.first, at.second, 300);
                              if (at == kRejectedOutput) throw Reject("black frames");
                              return std::move(x);
                          })
                .serial_batched(
                    "encode_vae", batch_size,
                    [&, run](std::vector<std::any>&& xs) {
                        std::vector<IndexSub> batch;
                        for (const std::any& x : xs) batch.push_back(index_sub_of(as_int(x)));
                        jitter(run, batch.front().first, batch.front().second, 300);
                        batches.push_back(batch);
                        return std::move(xs);
                    },
                    ItemOrder::kSource)
                .parallel("post", 2,
                          [run](std::any&& x) -> std::any {
                              const IndexSub at = index_sub_of(as_int(x));
                              jitter(run, at.first, at.second + 1, 200);
                              return std::move(x);
                          })
                .sink(
                    "write", [&](std::any&& x) { written.push_back(index_sub_of(as_int(x))); },
                    SinkOrder::kSource)
                .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
                .progress(quiet());
            const RunStats stats = with_watchdog(20s, [&] { return pipeline.run(); });

            ASSERT_EQ(batches, expected) << name;
            EXPECT_EQ(written, sequence) << name;
            ASSERT_EQ(rejects.size(), 2u) << name;
            EXPECT_EQ(stats.rejected, 2) << name;
            EXPECT_EQ(stats.produced, static_cast<int64_t>(counts.size())) << name;
            EXPECT_EQ(stats.expanded, static_cast<int64_t>(counts.size()) - 1) << name;
            EXPECT_EQ(stats.outputs, static_cast<int64_t>(sequence.size()) + 1) << name;
            EXPECT_EQ(stats.completed, static_cast<int64_t>(sequence.size())) << name;
            EXPECT_LE(stats.max_in_flight_observed, tokens) << name;
            EXPECT_LE(stats.max_inputs_in_flight_observed, tokens) << name;
            expect_accounted(stats);
        }
    }
}

TEST(LinearPipelineExpand, StagesSeeTheIndexSubAndLabelOfTheirOutput) {
    std::atomic<int> mismatches{0};
    std::vector<RejectInfo> rejects;
    LinearPipeline pipeline("context", 3);
    pipeline.source("clips", items_with_counts({2, 3, 1}))
        .describe([](const std::any&) { return "clip_" + std::to_string(current_item()->index); })
        .expand("windows",
                [&](std::any&& x) {
                    const ItemContext* item = current_item();
                    if (item == nullptr || item->sub != -1 ||
                        item->label != "clip_" + std::to_string(item->index)) {
                        ++mismatches;
                    }
                    return expand_counts([&](int64_t index, int64_t sub) {
                        // The next function sees the output it is making.
                        const ItemContext* at = current_item();
                        if (at->index != index || at->sub != sub) ++mismatches;
                    })(std::move(x));
                })
        .parallel("check", 2,
                  [&](std::any&& x) -> std::any {
                      const ItemContext* item = current_item();
                      if (IndexSub(item->index, item->sub) != index_sub_of(as_int(x)) ||
                          item->label != "clip_" + std::to_string(item->index) ||
                          item->cancel != &pipeline.cancel_token()) {
                          ++mismatches;
                      }
                      if (item->index == 1 && item->sub == 2) throw Reject("blurry window");
                      return std::move(x);
                  })
        .sink("write", [](std::any&&) {})
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_EQ(mismatches.load(), 0);
    ASSERT_EQ(rejects.size(), 1u);
    EXPECT_EQ(rejects[0].index, 1);
    EXPECT_EQ(rejects[0].sub, 2);
    EXPECT_EQ(rejects[0].label, "clip_1");
    EXPECT_EQ(rejects[0].stage, "check");
    EXPECT_EQ(stats.completed, 5);
    EXPECT_EQ(stats.rejected, 1);
    expect_accounted(stats);
}

TEST(LinearPipelineExpand, RejectWhenOpeningRejectsTheItemAndTheRunGoesOn) {
    std::vector<IndexSub> written;
    std::vector<RejectInfo> rejects;
    LinearPipeline pipeline("open_reject", 4);
    pipeline.source("clips", items_with_counts({2, 5, 3}))
        .describe([](const std::any&) { return "clip_" + std::to_string(current_item()->index); })
        .expand("windows",
                [inner = expand_counts()](std::any&& x) {
                    if (current_item()->index == 1) throw Reject("no decoder for codec");
                    return inner(std::move(x));
                })
        .sink(
            "write", [&](std::any&& x) { written.push_back(index_sub_of(as_int(x))); },
            SinkOrder::kSource)
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_EQ(written, outputs_of({2, 5, 3}, {1}));
    ASSERT_EQ(rejects.size(), 1u);
    EXPECT_EQ(rejects[0].stage, "windows");
    EXPECT_EQ(rejects[0].index, 1);
    EXPECT_EQ(rejects[0].sub, -1);
    EXPECT_EQ(rejects[0].label, "clip_1");
    EXPECT_EQ(rejects[0].reason, "no decoder for codec");
    EXPECT_EQ(stats.expanded, 2);
    EXPECT_EQ(stats.rejected, 1);
    EXPECT_EQ(stats.outputs, 5);
    EXPECT_EQ(stats.stages[1].items, 2);
    EXPECT_EQ(stats.stages[1].rejects, 1);
    expect_accounted(stats);
}

// A stream that breaks mid-clip: the windows decoded before the break are written, and the clip is
// reported rejected (the video stage records it as truncated).
TEST(LinearPipelineExpand, RejectMidExpansionKeepsTheOutputsMadeBeforeIt) {
    const std::vector<int64_t> counts = {4, 10, 4};
    std::vector<IndexSub> written;
    std::vector<RejectInfo> rejects;
    LinearPipeline pipeline("mid_reject", 4);
    pipeline.source("clips", items_with_counts(counts))
        .describe([](const std::any&) { return "clip_" + std::to_string(current_item()->index); })
        .expand("windows", expand_counts([](int64_t index, int64_t sub) {
                    if (index == 1 && sub == 6) throw Reject("stream broke at frame 96");
                }))
        .sink(
            "write",
            [&](std::any&& x) {
                std::this_thread::sleep_for(100us);
                written.push_back(index_sub_of(as_int(x)));
            },
            SinkOrder::kSource)
        .on_reject([&](const RejectInfo& r) { rejects.push_back(r); })
        .progress(quiet());
    const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });

    std::vector<IndexSub> expected = outputs_of({4, 6, 4});
    EXPECT_EQ(written, expected);
    ASSERT_EQ(rejects.size(), 1u);
    EXPECT_EQ(rejects[0].stage, "windows");
    EXPECT_EQ(rejects[0].index, 1);
    EXPECT_EQ(rejects[0].sub, -1);
    EXPECT_EQ(rejects[0].label, "clip_1");
    EXPECT_EQ(rejects[0].reason, "stream broke at frame 96");
    EXPECT_EQ(stats.expanded, 2);
    EXPECT_EQ(stats.rejected, 1);
    EXPECT_EQ(stats.outputs, 14);
    EXPECT_EQ(stats.completed, 14);
    EXPECT_FALSE(stats.cancelled);
    expect_accounted(stats);
}

TEST(LinearPipelineExpand, FatalErrorMidExpansionIsRethrownWithItsTypeAndDoesNotHang) {
    constexpr int kTokens = 4;
    LiveExpansions expansions;
    std::vector<IndexSub> written;
    LinearPipeline pipeline("mid_fatal", kTokens);
    pipeline.source("clips", items_with_counts({3, 100000, 3, 3}))
        .parallel("probe", 2, [](std::any&& x) { return std::move(x); })
        .expand("windows", expansions.wrap(expand_counts([](int64_t index, int64_t sub) {
            if (index == 1 && sub == 20) throw DiskFull("no space left on device");
        })))
        .sink("write", [&](std::any&& x) { written.push_back(index_sub_of(as_int(x))); })
        .progress(quiet());

    expect_disk_full(pipeline);
    if (::testing::Test::HasFailure()) return;
    const RunStats& stats = pipeline.stats();
    EXPECT_TRUE(stats.cancelled);
    EXPECT_EQ(expansions.opened.load(), 2);
    EXPECT_EQ(expansions.alive.load(), 0) << "the open expansion was not destroyed";
    expect_accounted(stats);
    // Item 1's outputs 0..19 were made; the next function runs only with a free token, so at most
    // kTokens - 1 of them (and of item 0's) were still on their way, and dropped, when it failed.
    EXPECT_EQ(stats.outputs, 3 + 20);
    EXPECT_GE(stats.completed, 3 + 20 - (kTokens - 1));
    EXPECT_EQ(static_cast<int64_t>(written.size()), stats.completed);
    std::sort(written.begin(), written.end());
    EXPECT_TRUE(std::adjacent_find(written.begin(), written.end()) == written.end());
    for (const IndexSub& at : written) EXPECT_TRUE(at.first == 0 || at.second < 20);
    EXPECT_EQ(stats.expanded, 1);  // item 0; item 1 was dropped, items 2 and 3 never expanded
}

TEST(LinearPipelineExpand, FatalErrorWhenOpeningIsRethrownWithItsType) {
    LinearPipeline pipeline("open_fatal", 3);
    pipeline.source("clips", items_with_counts({5, 5, 5, 5, 5, 5}))
        .expand("windows",
                [inner = expand_counts()](std::any&& x) {
                    if (current_item()->index == 2) throw std::out_of_range("bad clip table");
                    return inner(std::move(x));
                })
        .serial_batched(
            "vae", 3, [](std::vector<std::any>&& xs) { return std::move(xs); }, ItemOrder::kSource)
        .sink(
            "write", [](std::any&&) {}, SinkOrder::kSource)
        .progress(quiet());
    EXPECT_THROW(with_watchdog(10s, [&] { return pipeline.run(); }), std::out_of_range);
    EXPECT_TRUE(pipeline.stats().cancelled);
    EXPECT_LE(pipeline.stats().outputs, 10);
    EXPECT_LE(pipeline.stats().completed, 10);
    expect_accounted(pipeline.stats());
}

TEST(LinearPipelineExpand, AnEmptyNextFunctionIsFatal) {
    LinearPipeline pipeline("no_next", 2);
    pipeline.source("clips", items_with_counts({1, 1}))
        .expand("windows", [](std::any&&) { return LinearPipeline::SourceFn(); })
        .sink("write", [](std::any&&) {})
        .progress(quiet());
    sf::test::expect_error([&] { with_watchdog(10s, [&] { return pipeline.run(); }); },
                           ErrorCode::kInvalidArgument, "windows returned an empty next function");
    expect_accounted(pipeline.stats());
}

// cancel() while one long expansion is open: it stops after the call under way, its state is
// destroyed, and run() returns normally.
TEST(LinearPipelineExpand, CancelDuringAnExpansionStopsItWithoutAnError) {
    std::atomic<int> calls_after_cancel{0};
    LiveExpansions expansions;
    int64_t written = 0;
    LinearPipeline pipeline("interrupted", 4);
    pipeline.source("clips", items_with_counts({2, 900, 900}))
        .expand("windows", expansions.wrap(expand_counts([&](int64_t, int64_t) {
            if (pipeline.cancel_token().cancelled()) ++calls_after_cancel;
        })))
        .serial_batched(
            "vae", 2, [](std::vector<std::any>&& xs) { return std::move(xs); }, ItemOrder::kSource)
        .sink(
            "write",
            [&](std::any&&) {
                if (++written == 10) pipeline.cancel();
            },
            SinkOrder::kSource)
        .progress(quiet());
    const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
    EXPECT_TRUE(stats.cancelled);
    EXPECT_EQ(stats.completed, 10);
    EXPECT_LE(calls_after_cancel.load(), 1);
    // The 10th output held one of the 4 tokens when cancel() came, so at most 3 more outputs
    // existed or were being made.
    EXPECT_LE(stats.outputs, 10 + 3);
    EXPECT_GE(stats.dropped, 2);  // item 1, open, and item 2, never opened
    EXPECT_EQ(stats.expanded, 1);
    EXPECT_EQ(expansions.opened.load(), 2);
    EXPECT_EQ(expansions.alive.load(), 0) << "the open expansion was not destroyed";
    expect_accounted(stats);
}

// Parking nodes before and after the expand stage hold tokens the others wait for; the run still
// ends, with every output. With 4 tokens: item 0 is slow, so items 1..3 fill the arrival-order
// batch and wait at the expand stage for item 0, which then sits alone in the batch with no source
// token left to fill it, while the expand stage holds every output token, free. Only the stall
// rule moves it, so the free tokens must count as parked.
TEST(LinearPipelineExpand, BatchStagesAroundTheExpandStageDoNotStall) {
    const std::vector<int64_t> counts = {3, 0, 5, 1, 7, 0, 2, 4, 0, 6};
    for (int tokens : {3, 4, 5, 6}) {
        std::vector<IndexSub> written;
        LinearPipeline pipeline("parked", tokens);
        pipeline.source("clips", items_with_counts(counts))
            .parallel("probe", 3,
                      [](std::any&& x) -> std::any {
                          if (current_item()->index % 4 == 0) std::this_thread::sleep_for(3ms);
                          return std::move(x);
                      })
            .serial_batched("group", 3, [](std::vector<std::any>&& xs) { return std::move(xs); })
            .expand("windows", expand_counts())
            .serial_batched(
                "a", 3, [](std::vector<std::any>&& xs) { return std::move(xs); },
                ItemOrder::kSource)
            .parallel("mid", 2, [](std::any&& x) { return std::move(x); })
            .serial_batched("b", 2, [](std::vector<std::any>&& xs) { return std::move(xs); })
            .sink(
                "write", [&](std::any&& x) { written.push_back(index_sub_of(as_int(x))); },
                SinkOrder::kSource)
            .progress(quiet());
        const RunStats stats = with_watchdog(10s, [&] { return pipeline.run(); });
        EXPECT_EQ(written, outputs_of(counts)) << tokens << " tokens";
        expect_accounted(stats);
    }
}

// Progress is in source items: the number of outputs is unknown in advance.
TEST(LinearPipelineExpand, ProgressCountsSourceItems) {
    const char* env = std::getenv("SANAFLOW_PROGRESS");
    const std::string saved = env ? env : "";
    unsetenv("SANAFLOW_PROGRESS");
    std::FILE* file = std::tmpfile();
    ASSERT_NE(file, nullptr);
    {
        LinearPipeline pipeline("prog", 4);
        pipeline.source("clips", items_with_counts({0, 1, 50, 2}), 4)
            .expand("windows",
                    [inner = expand_counts()](std::any&& x) {
                        if (current_item()->index == 3) throw Reject("corrupt");
                        return inner(std::move(x));
                    })
            .sink("write", [](std::any&&) {})
            .progress(ProgressOptions{ProgressMode::kPlain, 3600.0, 0.1, file});
        with_watchdog(10s, [&] { return pipeline.run(); });
    }
    if (env) setenv("SANAFLOW_PROGRESS", saved.c_str(), 1);
    std::string text(4096, '\0');
    std::rewind(file);
    text.resize(std::fread(text.data(), 1, text.size(), file));
    std::fclose(file);
    EXPECT_EQ(text.rfind("prog: 4/4 (100.0%)", 0), 0u) << text;
}

TEST(LinearPipelineExpand, ASecondExpandStageIsRefusedNamingTheFirst) {
    LinearPipeline pipeline("two", 4);
    pipeline.source("clips", items_with_counts({1})).expand("windows", expand_counts());
    try {
        pipeline.expand("frames", expand_counts());
        FAIL() << "no exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("stage frames"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("at most one expand stage, and windows is one"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(pipeline.expand("empty", LinearPipeline::ExpandFn()), Error);
    LinearPipeline no_source("no_source", 4);
    EXPECT_THROW(no_source.expand("windows", expand_counts()), Error);
}

TEST(LinearPipelineExpand, PlanShowsTheExpandStageTheSecondPoolAndTheDeviceLease) {
    LinearPipeline pipeline("prep/video", 4);
    pipeline.source("clips", items_with_counts({1}))
        .parallel("probe", 3, [](std::any&& x) { return std::move(x); })
        .expand("windows", expand_counts())
        .serial_batched(
            "encode_vae", 2, [](std::vector<std::any>&& xs) { return std::move(xs); },
            ItemOrder::kSource)
        .holds_device_lease()
        .sink(
            "write", [](std::any&&) {}, SinkOrder::kSource);
    const std::string plan = pipeline.plan();
    EXPECT_NE(plan.find("pipeline prep/video: at most 4 items in flight (token pool), and 4 "
                        "outputs of windows (second pool)"),
              std::string::npos)
        << plan;
    auto line_of = [&](const std::string& stage) {  // the stage's line: "  kind     name ..."
        std::istringstream lines(plan);
        for (std::string line, kind, name; std::getline(lines, line);) {
            std::istringstream(line) >> kind >> name;
            if (name == stage) return line;
        }
        return std::string();
    };
    EXPECT_EQ(line_of("windows").rfind("  expand", 0), 0u) << plan;
    EXPECT_NE(line_of("windows").find("second pool (4 tokens)"), std::string::npos) << plan;
    EXPECT_NE(line_of("encode_vae").find("batch 2, source order, holds the device lease"),
              std::string::npos)
        << plan;
    EXPECT_EQ(plan.find("device lease"), plan.rfind("device lease")) << "declared once: " << plan;

    LinearPipeline other("other", 2);
    EXPECT_THROW(other.holds_device_lease(), Error);  // no stage yet
    other.source("list", items_with_counts({1})).parallel("decode", 3, [](std::any&& x) {
        return std::move(x);
    });
    sf::test::expect_error([&] { other.holds_device_lease(); }, ErrorCode::kInvalidArgument,
                           "stage decode: runs 3 bodies at once");
    other.serial("encode", [](std::any&& x) { return std::move(x); }).holds_device_lease(1);
    EXPECT_NE(other.plan().find("holds the device lease of device 1"), std::string::npos)
        << other.plan();
}

}  // namespace
}  // namespace sf::graph
