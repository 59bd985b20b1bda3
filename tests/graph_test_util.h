// Helpers shared by the graph tests.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

#include "graph/pipeline.h"

namespace sf::graph::testing {

// A fatal error of stage code that is not an sf::Error: it must come back out of run() as itself.
struct DiskFull : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Runs `pipeline` (under a watchdog) and expects the DiskFull one of its stages threw.
inline void expect_disk_full(LinearPipeline& pipeline);

// Runs fn on its own thread and returns its result (rethrowing its exception, type intact). A
// graph that hangs must fail with a message rather than stall the suite until ctest's timeout,
// and a hung thread cannot be joined, so past `limit` the process exits.
template <typename Fn>
auto with_watchdog(std::chrono::milliseconds limit, Fn fn) -> decltype(fn()) {
    auto future = std::async(std::launch::async, std::move(fn));
    if (future.wait_for(limit) == std::future_status::timeout) {
        std::fprintf(stderr, "watchdog: %s.%s did not finish within %lld ms\n",
                     ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name(),
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                     static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::_Exit(3);
    }
    return future.get();
}

// The CPUs this process may run on. TBB sizes its threads by the affinity mask (taskset), which
// std::thread::hardware_concurrency() ignores.
inline int usable_cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return static_cast<int>(std::thread::hardware_concurrency());
}

// A source of the integers 0 .. n-1.
inline LinearPipeline::SourceFn count_to(int64_t n) {
    auto next = std::make_shared<int64_t>(0);
    return [next, n](std::any& out) {
        if (*next >= n) return false;
        out = (*next)++;
        return true;
    };
}

inline int64_t as_int(const std::any& item) { return std::any_cast<int64_t>(item); }

// The high-water mark of a counter that several threads move: a test's own count of the items in
// flight, to check the runtime's bound against.
struct InFlight {
    std::atomic<int> now{0};
    std::atomic<int> max{0};
    void enter() {
        const int n = ++now;
        int seen = max.load();
        while (n > seen && !max.compare_exchange_weak(seen, n)) {
        }
    }
    void leave() { --now; }
};

inline ProgressOptions quiet() { return ProgressOptions{ProgressMode::kOff}; }

inline void expect_disk_full(LinearPipeline& pipeline) {
    bool caught = false;
    with_watchdog(std::chrono::seconds(10), [&] {
        try {
            pipeline.run();
        } catch (const DiskFull& e) {
            caught = true;
            EXPECT_STREQ(e.what(), "no space left on device");
        }
    });
    EXPECT_TRUE(caught) << "the stage's exception type was not rethrown";
}

}  // namespace sf::graph::testing
