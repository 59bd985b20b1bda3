// The launcher's environment: torchrun's variables, Slurm's, neither; bad values named. ZeRO-1's
// partition and its collectives, and the gradient buckets started inside the backward pass,
// between ranks that are threads of this process.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include "core/error.h"
#include "distributed_test_util.h"
#include "model/common/lora.h"
#include "model/sana/sana_transformer.h"
#include "stages/distributed/data_parallel_sync.h"
#include "stages/distributed/gradient_buckets.h"
#include "stages/distributed/launch_env.h"
#include "stages/distributed/world.h"
#include "stages/distributed/zero_sharding.h"
#include "stages/train/train_step.h"
#include "test_util.h"

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

// Every rank's share is within the largest parameter of an even split, whatever the sizes, and
// the partition is a function of the sizes alone (every rank computes the same one).
TEST(ZeroPartition, BalancesBytesWithinTheLargestParameterAndIsTheSameEachTime) {
    std::mt19937 gen(7);
    for (int world : {1, 2, 3, 5}) {
        for (int trial = 0; trial < 20; ++trial) {
            std::vector<int64_t> bytes(1 + gen() % 60);
            for (auto& b : bytes) b = 4 * (1 + static_cast<int64_t>(gen() % 5000));
            const std::vector<int> owners = sf::distributed::partition_by_size(bytes, world);
            ASSERT_EQ(owners, sf::distributed::partition_by_size(bytes, world));
            std::vector<int64_t> load(world, 0);
            for (size_t i = 0; i < bytes.size(); ++i) {
                ASSERT_GE(owners[i], 0);
                ASSERT_LT(owners[i], world);
                load[owners[i]] += bytes[i];
            }
            const int64_t total = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
            const int64_t largest = *std::max_element(bytes.begin(), bytes.end());
            for (int64_t l : load) EXPECT_LE(l, total / world + largest) << world;
        }
    }
}

// Two ranks (threads, Gloo on 127.0.0.1): each gradient's sum lands with its owner only, each
// owner's new weights reach the other rank, and rank 0 gathers every rank's state.
TEST(ShardedStateSync, ReducesToTheOwnerSharesUpdatesAndGathersTheState) {
    const int port = sf::test::free_port();
    const std::vector<int64_t> sizes = {40, 24, 20, 3};
    std::vector<std::vector<bool>> owned(2);
    std::vector<std::vector<torch::Tensor>> params(2), grads(2);
    std::vector<std::map<std::string, at::Tensor>> gathered(2);
    ASSERT_TRUE(sf::test::on_ranks(2, [&](int r) {
        sf::distributed::ShardedStateSync sync(sf::test::thread_rank(r, 2, port));
        for (int64_t n : sizes) {
            params[r].push_back(torch::full({n}, 1.0).requires_grad_());
            params[r].back().mutable_grad() = torch::full({n}, r + 1.0);
        }
        owned[r] = sync.partition(params[r]);
        sync.reduce_all(params[r]);
        for (const auto& p : params[r]) grads[r].push_back(p.grad());
        std::map<std::string, at::Tensor> mine;
        for (size_t i = 0; i < sizes.size(); ++i) {
            if (!owned[r][i]) continue;
            torch::NoGradGuard no_grad;
            params[r][i].add_(static_cast<double>(i + 1));  // the owner's update
            mine[std::to_string(i) + ".exp_avg"] = torch::full({sizes[i]}, 10.0 * i + r);
        }
        sync.share_updates(params[r]);
        gathered[r] = sync.gather_state(mine);
    }));
    std::array<int64_t, 2> bytes = {0, 0};
    for (size_t i = 0; i < sizes.size(); ++i) {
        SCOPED_TRACE(i);
        ASSERT_NE(owned[0][i], owned[1][i]) << "exactly one owner";
        const int owner = owned[0][i] ? 0 : 1;
        bytes[owner] += sizes[i];
        EXPECT_TRUE(torch::equal(grads[owner][i], torch::full({sizes[i]}, 3.0)));
        EXPECT_FALSE(grads[1 - owner][i].defined());
        for (int r = 0; r < 2; ++r)
            EXPECT_TRUE(torch::equal(params[r][i].detach(), torch::full({sizes[i]}, 2.0 + i)));
        const std::string key = std::to_string(i) + ".exp_avg";
        ASSERT_EQ(gathered[0].count(key), 1u);
        EXPECT_TRUE(torch::equal(gathered[0][key], torch::full({sizes[i]}, 10.0 * i + owner)));
    }
    EXPECT_EQ(gathered[0].size(), sizes.size());
    EXPECT_EQ(std::max(bytes[0], bytes[1]), 24 + 20);  // 40 + 3 on the other
}

// Two ranks of one sample each get the gradients one rank of both gets, with every gradient
// bucket (4 KiB each here, so many) started from inside the backward pass, in the same order on
// both. Two steps at learning rate 0: the second reduces into buckets laid out by the first.
TEST(DataParallelSync, BucketsStartInsideTheBackwardAndSumToTheWholeBatchsGradients) {
    auto config = sf::model::SanaTransformerConfig::named("sana-tiny");
    config.caption_channels = 16;
    auto make_model = [&] {
        torch::manual_seed(3);
        return sf::model::SanaTransformer(config);
    };
    torch::manual_seed(11);
    sf::train::MicroBatch batch;
    batch.latents = torch::randn({2, 32, 8, 8});
    batch.prompt_embeds = torch::randn({2, 5, 16});
    batch.prompt_mask = torch::ones({2, 5}, torch::kLong);
    batch.prompt_mask[1].slice(0, 3).fill_(0);
    // Built here: threads drawing from the global generator at once would build other weights.
    std::vector<sf::model::SanaTransformer> models = {make_model(), make_model(), make_model()};
    auto train = [&](sf::model::SanaTransformer model,
                     std::shared_ptr<sf::train::GradientSync> sync) {
        sf::train::TrainStepOptions o;
        o.keep_gradients = true;
        sf::train::AdamWOptions a;
        a.lr = 0;
        sf::train::TrainStep step(model.ptr(), sf::model::trainable_parameters(*model), a,
                                  sf::train::LRSchedule("constant", 0, 0, 10), o,
                                  c10::Device(c10::kCPU), std::move(sync));
        at::Generator gen = at::detail::createCPUGenerator(1);
        for (int i = 0; i < 2; ++i) step.step([&](int64_t) { return batch; }, gen);
        return sf::model::trainable_parameters(*model);
    };
    const auto reference = train(models[2], nullptr);
    const int port = sf::test::free_port();
    std::vector<std::vector<std::pair<std::string, at::Tensor>>> weights(2);  // with grads
    std::vector<int64_t> started(2), buckets(2);
    ASSERT_TRUE(sf::test::on_ranks(2, [&](int r) {
        auto sync =
            std::make_shared<sf::distributed::DataParallelSync>(sf::test::thread_rank(r, 2, port),
                                                                /*bucket_bytes=*/4096);
        weights[r] = train(models[static_cast<size_t>(r)], sync);
        started[r] = sync->buckets_started_in_backward();
        buckets[r] = static_cast<int64_t>(sync->bucket_count());
    }));
    EXPECT_GT(buckets[0], 4);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(started[r], buckets[r]) << "rank " << r;
    for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(weights[r].size(), reference.size());
        for (size_t i = 0; i < reference.size(); ++i) {
            EXPECT_TRUE(torch::allclose(weights[r][i].second.grad(), reference[i].second.grad(),
                                        1e-4, 1e-6))
                << "rank " << r << ": " << reference[i].first;
        }
    }
}

TEST(World, BackendsResolveOrAreRefusedNamingTheFlag) {
    using sf::distributed::resolve_backend;
    EXPECT_EQ(resolve_backend("gloo", false), "gloo");
    EXPECT_EQ(resolve_backend("gloo", true), "gloo");
    EXPECT_EQ(resolve_backend("auto", false), "gloo");
    EXPECT_EQ(resolve_backend("auto", true), sf::distributed::nccl_built() ? "nccl" : "gloo");
    auto refusal = [](const std::string& backend, bool cuda) {
        try {
            resolve_backend(backend, cuda);
        } catch (const sf::Error& e) {
            EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    const std::string cpu_nccl = refusal("nccl", false);
    EXPECT_NE(cpu_nccl.find("--ddp_backend nccl"), std::string::npos) << cpu_nccl;
    EXPECT_NE(cpu_nccl.find(sf::distributed::nccl_built() ? "--device cuda" : "no NCCL"),
              std::string::npos)
        << cpu_nccl;
    if (sf::distributed::nccl_built()) {
        EXPECT_EQ(resolve_backend("nccl", true), "nccl");
    }
    const std::string unknown = refusal("mpi", false);
    EXPECT_NE(unknown.find("--ddp_backend mpi"), std::string::npos) << unknown;
}

// Where the build has NCCL: on a GPU one rank's NCCL all-reduce of a CUDA tensor leaves it as it
// is; without one the process group is refused with a message naming it. Either way nothing
// crashes: ProcessGroupNCCL's inline parts and LibTorch agree on its layout (a mismatched nccl.h
// crashed at its construction).
TEST(World, TheNcclProcessGroupRunsOrIsRefusedWithoutAGpu) {
    if (!sf::distributed::nccl_built()) GTEST_SKIP() << "no NCCL in this build";
    try {
        auto world = sf::test::thread_rank(0, 1, sf::test::free_port(), "nccl", true);
        ASSERT_TRUE(torch::cuda::is_available()) << "NCCL started without a GPU";
        std::vector<at::Tensor> t = {torch::arange(8, torch::kFloat).cuda()};
        world->all_reduce_sum(t, "a test all-reduce");
        EXPECT_TRUE(torch::equal(t[0].cpu(), torch::arange(8, torch::kFloat)));
    } catch (const sf::Error& e) {
        EXPECT_FALSE(torch::cuda::is_available()) << e.what();
        EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
    }
}

// The buckets alone, with a collective that doubles its tensor when waited for (what summing
// two ranks of equal gradients gives), over four 16-byte gradients. A bucket starts only once it
// and every bucket before it are complete, holding its gradients in place of the parameters';
// finish() starts the rest (a gradient that never completed goes as it is), reduces a gradient
// completed twice apart, and drops what `keep` refuses.
TEST(GradientBuckets, StartInOrderAsTheyCompleteAndLeaveEachSum) {
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 4; ++i) {
        params.push_back(torch::zeros({4}).requires_grad_());
        params.back().mutable_grad() = torch::full({4}, i + 1.0);
    }
    std::vector<int> started_tags;
    sf::distributed::GradientBuckets buckets(
        params, {0, 1, 0, 1}, 16, [&](const at::Tensor& flat, int tag) {
            started_tags.push_back(tag);
            return sf::distributed::PendingCollective([flat] { flat.mul_(2); });
        });
    ASSERT_EQ(buckets.bucket_count(), 4u);  // one gradient each, in reverse: {3}, {2}, {1}, {0}
    buckets.begin();
    buckets.ready(2);  // its bucket waits for {3}'s
    EXPECT_TRUE(started_tags.empty());
    EXPECT_TRUE(params[2].grad().defined());
    buckets.ready(3);  // {3} and {2} start, in order
    EXPECT_EQ(started_tags, (std::vector<int>{1, 0}));
    EXPECT_FALSE(params[3].grad().defined()) << "the bucket holds it";
    EXPECT_EQ(buckets.started_in_backward(), 2);
    params[3].mutable_grad() = torch::full({4}, 10.0);  // a second share after its bucket left
    buckets.ready(3);
    buckets.ready(1);  // {1} starts; {0} never completes
    buckets.finish([](int tag) { return tag == 0; });
    EXPECT_EQ(started_tags, (std::vector<int>{1, 0, 1, 0, 1}));  // the late share last
    EXPECT_FALSE(params[3].grad().defined()) << "tag 1 is not kept";
    EXPECT_FALSE(params[1].grad().defined());
    EXPECT_TRUE(torch::equal(params[0].grad(), torch::full({4}, 2.0)));
    EXPECT_TRUE(torch::equal(params[2].grad(), torch::full({4}, 6.0)));

    // Untagged, 32-byte buckets {3, 2} and {1, 0}, everything kept: the late share is added to the
    // sum, and the bucket whose gradients never completed goes at finish() as they are.
    sf::distributed::GradientBuckets kept(params, {}, 32, [&](const at::Tensor& flat, int) {
        return sf::distributed::PendingCollective([flat] { flat.mul_(2); });
    });
    for (int i = 0; i < 4; ++i)
        params[static_cast<size_t>(i)].mutable_grad() = torch::full({4}, i + 1.0);
    kept.begin();
    kept.ready(3);
    kept.ready(2);
    params[3].mutable_grad() = torch::full({4}, 10.0);
    kept.ready(3);
    kept.finish([](int) { return true; });
    EXPECT_EQ(kept.bucket_count(), 2u);
    EXPECT_EQ(kept.started_in_backward(), 1);
    EXPECT_TRUE(torch::equal(params[3].grad(), torch::full({4}, 2.0 * (4 + 10))));
    EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({4}, 4.0)));
    EXPECT_TRUE(torch::equal(params[0].grad(), torch::full({4}, 2.0)));
}

// Accumulators of parameters on two devices call ready() from two threads at once: 20000
// gradients in buckets of two, each bucket's pair completed by the two threads together, start
// every bucket once, in order (unguarded, the threads lose counts and start twice or never).
TEST(GradientBuckets, ReadyFromTwoThreadsStartsEveryBucketOnceInOrder) {
    constexpr int kParams = 20000;
    std::vector<torch::Tensor> params;
    for (int i = 0; i < kParams; ++i) {
        params.push_back(torch::zeros({1}).requires_grad_());
        params.back().mutable_grad() = torch::full({1}, static_cast<double>(i));
    }
    std::vector<int> started;  // the first gradient of each started bucket, in start order
    sf::distributed::GradientBuckets buckets(params, {}, 8, [&](const at::Tensor& flat, int) {
        started.push_back(static_cast<int>(flat[0].item<float>()));
        return sf::distributed::PendingCollective();
    });
    ASSERT_EQ(buckets.bucket_count(), static_cast<size_t>(kParams / 2));
    buckets.begin();
    std::atomic<int> waiting{2};
    auto complete = [&](int first) {
        for (--waiting; waiting.load() > 0;) {
        }
        for (int i = kParams - 1 - first; i >= 0; i -= 2) buckets.ready(static_cast<size_t>(i));
    };
    std::thread other(complete, 1);
    complete(0);
    other.join();
    EXPECT_EQ(buckets.started_in_backward(), kParams / 2);
    ASSERT_EQ(started.size(), static_cast<size_t>(kParams / 2));
    for (int k = 0; k < kParams / 2; ++k) {
        ASSERT_EQ(started[static_cast<size_t>(k)], kParams - 1 - 2 * k) << "bucket " << k;
    }
    buckets.finish([](int) { return true; });
}

}  // namespace
