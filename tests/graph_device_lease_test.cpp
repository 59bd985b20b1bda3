// DeviceLease: one holder at a time, released by scope, cancel-aware waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "graph/device_lease.h"
#include "graph/pipeline.h"
#include "graph_test_util.h"

namespace sf::graph {
namespace {

using namespace std::chrono_literals;

TEST(DeviceLease, TwoPhasesNeverHoldTheDeviceAtOnce) {
    DeviceLease lease(0);
    std::atomic<int> holders{0};
    std::atomic<int> overlaps{0};
    std::atomic<int> holds{0};
    auto phase = [&](const char* name) {
        for (int i = 0; i < 50; ++i) {
            DeviceLease::Hold hold = lease.acquire(name);
            if (++holders != 1) ++overlaps;
            ++holds;
            std::this_thread::sleep_for(100us);
            --holders;
        }
    };
    std::thread text(phase, "encode_text");
    std::thread vae(phase, "encode_vae");
    text.join();
    vae.join();
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_EQ(holds.load(), 100);
    EXPECT_EQ(lease.holder(), "");
}

TEST(DeviceLease, HoldReleasesAtScopeExitAndMovesOwnership) {
    DeviceLease lease(1);
    {
        DeviceLease::Hold hold = lease.acquire("encode_vae");
        EXPECT_TRUE(hold.held());
        EXPECT_EQ(lease.holder(), "encode_vae");
        EXPECT_FALSE(lease.try_acquire("encode_text").held());

        DeviceLease::Hold moved = std::move(hold);
        EXPECT_FALSE(hold.held());
        EXPECT_TRUE(moved.held());
        EXPECT_EQ(lease.holder(), "encode_vae");
    }
    EXPECT_EQ(lease.holder(), "");
    DeviceLease::Hold again = lease.try_acquire("encode_text");
    EXPECT_TRUE(again.held());
    again.release();
    EXPECT_FALSE(again.held());
    EXPECT_EQ(lease.holder(), "");
}

TEST(DeviceLease, WaiterGetsTheDeviceWhenTheHolderReleases) {
    DeviceLease lease(0);
    DeviceLease::Hold first = lease.acquire("encode_text");
    std::atomic<bool> got{false};
    std::thread waiter([&] {
        DeviceLease::Hold hold = lease.acquire("encode_vae");
        got = true;
    });
    std::this_thread::sleep_for(30ms);
    EXPECT_FALSE(got.load());
    first.release();
    waiter.join();
    EXPECT_TRUE(got.load());
}

TEST(DeviceLease, CancelledWaitGivesUpAndLeavesOtherWaitersWaiting) {
    DeviceLease lease(0);
    DeviceLease::Hold holder = lease.acquire("train");
    CancelToken cancel;
    std::atomic<bool> threw{false};
    std::atomic<bool> other_got{false};
    std::thread cancelled([&] {
        try {
            lease.acquire("encode_vae", &cancel);
        } catch (const Cancelled&) {
            threw = true;
        }
    });
    std::thread other([&] {
        DeviceLease::Hold hold = lease.acquire("encode_text");
        other_got = true;
    });
    std::this_thread::sleep_for(20ms);
    cancel.cancel();
    cancelled.join();
    EXPECT_TRUE(threw.load());
    EXPECT_FALSE(other_got.load());
    holder.release();
    other.join();
    EXPECT_TRUE(other_got.load());
}

// Two phases as two pipelines running at once, each taking the lease around its device batches:
// their CPU stages overlap, their device work never does.
TEST(DeviceLease, TwoPipelinesTakeTurnsOnTheDevice) {
    DeviceLease lease(0);
    std::atomic<int> holders{0};
    std::atomic<int> overlaps{0};
    auto phase = [&](const std::string& name) {
        auto next = std::make_shared<int64_t>(0);
        LinearPipeline pipeline(name, 4);
        pipeline
            .source("count",
                    [next](std::any& out) {
                        out = *next;
                        return ++*next <= 40;
                    })
            .parallel("cpu", 2, [](std::any&& x) { return std::move(x); })
            .serial_batched("device", 4,
                            [&](std::vector<std::any>&& xs) {
                                DeviceLease::Hold hold =
                                    lease.acquire(name, current_item()->cancel);
                                if (++holders != 1) ++overlaps;
                                std::this_thread::sleep_for(200us);
                                --holders;
                                return std::move(xs);
                            })
            .sink("write", [](std::any&&) {})
            .progress(ProgressOptions{ProgressMode::kOff});
        return pipeline.run().completed;
    };
    testing::with_watchdog(10s, [&] {
        auto text = std::async(std::launch::async, phase, "encode_text");
        auto vae = std::async(std::launch::async, phase, "encode_vae");
        EXPECT_EQ(text.get(), 40);
        EXPECT_EQ(vae.get(), 40);
    });
    EXPECT_EQ(overlaps.load(), 0);
}

TEST(DeviceLease, ProcessWideLeaseIsOnePerDevice) {
    EXPECT_EQ(&device_lease(0), &device_lease(0));
    EXPECT_NE(&device_lease(0), &device_lease(1));
    EXPECT_EQ(device_lease(1).device(), 1);
    EXPECT_THROW(device_lease(-1), Error);
    EXPECT_THROW(device_lease(64), Error);
}

}  // namespace
}  // namespace sf::graph
