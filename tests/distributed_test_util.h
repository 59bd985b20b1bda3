// Helpers for tests whose ranks are threads of one process (stages_distributed_test.cpp,
// gpu_train_test.cpp): each rank joins through the store on 127.0.0.1.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stages/distributed/world.h"

namespace sf::test {

// Rank r of `size` ranks, the store at 127.0.0.1:`port` (rank 0 hosts it).
inline std::shared_ptr<distributed::World> thread_rank(int r, int size, int port,
                                                       const std::string& backend = "gloo",
                                                       bool cuda = false) {
    distributed::LaunchEnv env;
    env.launcher = "torchrun";
    env.rank = env.local_rank = r;
    env.world_size = env.local_world_size = size;
    env.master_port = port;
    distributed::WorldOptions o;
    o.backend = backend;
    o.timeout = std::chrono::seconds(120);
    return std::make_shared<distributed::World>(env, o, cuda);
}

// Runs body(r) for ranks 0 .. n-1, each but rank 0 on a thread of its own; false (with each
// error as a test failure) when any threw.
inline bool on_ranks(int n, const std::function<void(int)>& body) {
    std::vector<std::string> errors(static_cast<size_t>(n));
    auto rank = [&](int r) {
        try {
            body(r);
        } catch (const std::exception& e) {
            errors[static_cast<size_t>(r)] = e.what();
        }
    };
    std::vector<std::thread> others;
    for (int r = 1; r < n; ++r) others.emplace_back(rank, r);
    rank(0);
    for (auto& t : others) t.join();
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
        ok = ok && errors[static_cast<size_t>(r)].empty();
    }
    return ok;
}

}  // namespace sf::test
