// The launcher's environment: torchrun's variables, Slurm's, neither; bad values named.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "stages/distributed/launch_env.h"
#include "stages/train/train_step.h"

namespace {

using sf::distributed::first_slurm_host;
using sf::distributed::launch_env;
using sf::distributed::LaunchEnv;

LaunchEnv env_of(const std::map<std::string, std::string>& vars) {
    return launch_env([&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
}

TEST(LaunchEnv, TorchrunsVariablesAndItsAgentStore) {
    const LaunchEnv e = env_of({{"RANK", "3"},
                                {"WORLD_SIZE", "8"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "10.0.0.5"},
                                {"MASTER_PORT", "29400"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    EXPECT_EQ(e.launcher, "torchrun");
    EXPECT_EQ(e.rank, 3);
    EXPECT_EQ(e.world_size, 8);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.local_world_size, 2);
    EXPECT_EQ(e.master_addr, "10.0.0.5");
    EXPECT_EQ(e.master_port, 29400);
    EXPECT_TRUE(e.agent_store);
    EXPECT_TRUE(e.distributed());
    EXPECT_FALSE(env_of({}).distributed());
    EXPECT_EQ(env_of({}).launcher, "none");
}

TEST(LaunchEnv, SlurmsVariablesWithTheFirstHostOfTheNodeList) {
    const LaunchEnv e = env_of({{"SLURM_PROCID", "5"},
                                {"SLURM_NTASKS", "8"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                {"SLURM_JOB_NODELIST", "gpu[007-008]"}});
    EXPECT_EQ(e.launcher, "slurm");
    EXPECT_EQ(e.rank, 5);
    EXPECT_EQ(e.world_size, 8);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.local_world_size, 4);
    EXPECT_EQ(e.master_addr, "gpu007");
    EXPECT_EQ(e.master_port, 29500);
    EXPECT_FALSE(e.agent_store);
    // MASTER_ADDR, when the user sets it, wins over the node list.
    EXPECT_EQ(env_of({{"SLURM_PROCID", "0"},
                      {"SLURM_NTASKS", "2"},
                      {"SLURM_JOB_NODELIST", "a,b"},
                      {"MASTER_ADDR", "head"}})
                  .master_addr,
              "head");
    EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
    EXPECT_EQ(first_slurm_host("a,b[1-2]"), "a");
    EXPECT_EQ(first_slurm_host("single"), "single");
    EXPECT_THROW(first_slurm_host("bad[]"), sf::Error);
}

TEST(LaunchEnv, FilesEveryRankWritesTakeTheRankInTheirName) {
    LaunchEnv e;
    EXPECT_EQ(sf::distributed::per_rank_name("memory_timeline.json", e), "memory_timeline.json");
    e.rank = 2;
    e.world_size = 3;
    EXPECT_EQ(sf::distributed::per_rank_name("memory_timeline.json", e),
              "memory_timeline.rank-2.json");
    EXPECT_EQ(sf::distributed::per_rank_name("log", e), "log.rank-2");
}

TEST(LaunchEnv, BadValuesAreRefusedNamingTheVariable) {
    auto message = [](const std::map<std::string, std::string>& vars) {
        try {
            env_of(vars);
        } catch (const sf::Error& e) {
            EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(message({{"RANK", "0"}}).find("WORLD_SIZE"), std::string::npos);
    EXPECT_NE(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK=x"), std::string::npos);
    EXPECT_NE(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("rank 2 of a world of 2"),
              std::string::npos);
    EXPECT_NE(
        message(
            {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
            .find("local rank 2 of 2"),
        std::string::npos);
    EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}})
                  .find("MASTER_PORT=70000"),
              std::string::npos);
}

// Every sample of a micro-batch goes to exactly one rank, in order; with fewer samples than
// ranks the rest run one sample at weight 0.
TEST(RankShare, SplitsTheMicroBatchInOrderAndWeightsAnEmptyShareZero) {
    for (int64_t batch : {1, 2, 3, 4, 7}) {
        for (int world : {1, 2, 3}) {
            int64_t next = 0;
            double weights = 0;
            for (int r = 0; r < world; ++r) {
                const sf::train::RankShare s = sf::train::rank_share(batch, r, world);
                ASSERT_GE(s.count, 1);
                ASSERT_LE(s.first + s.count, batch);
                if (s.weight > 0) {
                    EXPECT_EQ(s.first, next) << batch << " " << world << " " << r;
                    next += s.count;
                }
                weights += s.weight * static_cast<double>(s.count);
            }
            EXPECT_EQ(next, batch) << batch << " over " << world;
            EXPECT_EQ(weights, static_cast<double>(batch));
        }
    }
}

}  // namespace
