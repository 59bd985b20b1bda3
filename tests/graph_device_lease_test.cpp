// DeviceLease: one holder at a time, released by scope, cancel-aware waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/error.h"
#include "graph/device_lease.h"

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

TEST(DeviceLease, ProcessWideLeaseIsOnePerDevice) {
    EXPECT_EQ(&device_lease(0), &device_lease(0));
    EXPECT_NE(&device_lease(0), &device_lease(1));
    EXPECT_EQ(device_lease(1).device(), 1);
    EXPECT_THROW(device_lease(-1), Error);
    EXPECT_THROW(device_lease(64), Error);
}

}  // namespace
}  // namespace sf::graph
