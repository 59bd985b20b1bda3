// Data-parallel training through c10d (Gloo on 127.0.0.1), the ranks started as torchrun starts
// them (the variables set by hand, and torchrun itself where the project's venv has it): N ranks
// of micro-batch b train what one rank of micro-batch N*b trains, a 3-rank run killed on one rank
// resumes bit-identically, a 2-rank checkpoint resumes on one rank, and a rank that dies makes
// the others stop naming it.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "integration_util.h"
#include "pipelines/prep/prep.h"
#include "storage/safetensors_file.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::test::TempDir;

const std::string& ddp_cache() {
    static TempDir tmp("sf_ddp_cache");
    static const std::string cache = [&] {
        sf::test::write_dataset(tmp.path() / "data", 0, 12);
        sf::pipelines::run_prep(sf::test::options_for(tmp));
        return tmp.file("cache");
    }();
    return cache;
}

// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// Starts `program` with `args` in a child with `env` added, its stderr into `log`.
pid_t start_with(const std::string& program, const std::vector<std::string>& args,
                 const std::vector<std::pair<std::string, std::string>>& env,
                 const std::string& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 2);
        ::dup2(fd, 1);
        std::vector<char*> argv;
        for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
        argv.push_back(nullptr);
        ::execv(program.c_str(), argv.data());
        ::_exit(127);
    }
    return pid;
}

std::vector<std::string> train_args(const std::string& out, int batch,
                                    const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"sanaflow",
                                  "train",
                                  "--cache_dir",
                                  ddp_cache(),
                                  "--output_dir",
                                  out,
                                  "--max_train_steps",
                                  "3",
                                  "--train_batch_size",
                                  std::to_string(batch),
                                  "--rank",
                                  "0",
                                  "--lr_warmup_steps",
                                  "0",
                                  "--learning_rate",
                                  "1e-3",
                                  "--ddp_timeout",
                                  "60",
                                  "--report_to",
                                  "none"};
    // A flag of `extra` replaces the same flag (and its value) of the base.
    for (const auto& flag : extra) {
        auto it = std::find(a.begin() + 2, a.end(), flag);
        if (flag.rfind("--", 0) == 0 && it != a.end()) a.erase(it, it + 2);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
}

// Runs `world` ranks of `args` with torchrun's variables; returns each rank's exit status.
std::vector<int> run_ranks(int world, const std::vector<std::string>& args, const std::string& logs,
                           std::vector<pid_t>* pids = nullptr) {
    const int port = free_port();
    std::vector<pid_t> started;
    for (int r = 0; r < world; ++r) {
        started.push_back(start_with(sf::test::kSanaflow, args,
                                     {{"RANK", std::to_string(r)},
                                      {"WORLD_SIZE", std::to_string(world)},
                                      {"LOCAL_RANK", std::to_string(r)},
                                      {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                      {"MASTER_ADDR", "127.0.0.1"},
                                      {"MASTER_PORT", std::to_string(port)}},
                                     fmt::format("{}.{}", logs, r)));
    }
    if (pids != nullptr) {
        *pids = started;
        return {};
    }
    std::vector<int> status;
    for (pid_t p : started) status.push_back(sf::test::wait_for(p));
    return status;
}

// The largest max|a - b| / max|b| over the tensors of two fp32 weight files.
double weight_difference(const std::string& a, const std::string& b) {
    const auto fa = sf::storage::SafetensorsFile::open(a);
    const auto fb = sf::storage::SafetensorsFile::open(b);
    EXPECT_EQ(fa.names(), fb.names());
    double worst = 0;
    for (const auto& name : fa.names()) {
        const auto va = fa.view(name), vb = fb.view(name);
        EXPECT_EQ(va.size(), vb.size()) << name;
        const auto* x = reinterpret_cast<const float*>(va.data());
        const auto* y = reinterpret_cast<const float*>(vb.data());
        double diff = 0, size = 0;
        for (size_t i = 0; i < va.size() / sizeof(float); ++i) {
            diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
            size = std::max(size, std::abs(static_cast<double>(y[i])));
        }
        if (size > 0) worst = std::max(worst, diff / size);
    }
    return worst;
}

std::vector<double> losses_in(const std::string& output_dir) {
    auto j =
        nlohmann::json::parse(sf::test::read_file(fs::path(output_dir) / "training_summary.json"));
    return j.at("losses").get<std::vector<double>>();
}

std::string weights_of(const std::string& out, bool lora) {
    return out + (lora ? "/pytorch_lora_weights.safetensors"
                       : "/transformer/diffusion_pytorch_model.safetensors");
}

TEST(TrainDataParallel, RanksOfPartBatchesTrainWhatOneRankWithTheWholeBatchTrains) {
    // The bounds are what summing the parts' gradients in another order leaves (measured: fp32
    // losses within 1e-7, weights within 6e-5 of the largest weight; LoRA's B, grown from zero
    // by AdamW's sign-like first steps, 9e-4); bf16 computes parts of another shape, so its
    // rounding differs (losses 2.4e-4, weights 3e-2); the fused pass updates each weight as its
    // reduced gradient arrives (weights 4.6e-4).
    struct Case {
        std::string name;
        int world, batch;
        std::vector<std::string> flags;
        double loss_bound = 1e-5, weight_bound = 2e-4;
        bool lora = false;
    };
    const std::vector<Case> cases = {
        {"full", 2, 2, {}},
        {"lora", 2, 2, {"--rank", "4"}, 1e-5, 3e-3, true},
        {"checkpointing, bf16, accumulation",
         2,
         2,
         {"--gradient_checkpointing", "--mixed_precision", "bf16", "--gradient_accumulation_steps",
          "2"},
         2e-3,
         0.1},
        {"fused backward", 2, 2, {"--fused_backward_pass", "--max_grad_norm", "0"}, 1e-5, 1e-3},
        {"3 ranks, a last batch smaller than the ranks", 3, 1, {"--max_train_steps", "5"}},
    };
    TempDir tmp("sf_ddp_equal");
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        const std::string one = tmp.file(c.name + " one"), many = tmp.file(c.name + " many");
        ASSERT_EQ(sf::test::wait_for(start_with(sf::test::kSanaflow,
                                                train_args(one, c.world * c.batch, c.flags), {},
                                                one + ".log")),
                  0)
            << sf::test::read_file(one + ".log");
        const auto status = run_ranks(c.world, train_args(many, c.batch, c.flags), many + ".log");
        for (int r = 0; r < c.world; ++r) {
            ASSERT_EQ(status[r], 0)
                << "rank " << r << "\n"
                << sf::test::read_file(fmt::format("{}.log.{}", many, r))
                << "\nthe last rank's log:\n"
                << sf::test::read_file(fmt::format("{}.log.{}", many, c.world - 1));
        }
        const std::vector<double> a = losses_in(one), b = losses_in(many);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(b[i], a[i], c.loss_bound * std::abs(a[i])) << i;
        const double d = weight_difference(weights_of(many, c.lora), weights_of(one, c.lora));
        std::printf("[ ddp     ] %s: %d ranks x %d vs 1 x %d: weights within %.2e relative\n",
                    c.name.c_str(), c.world, c.batch, c.world * c.batch, d);
        EXPECT_LT(d, c.weight_bound);
        EXPECT_FALSE(fs::exists(many + "/checkpoint-1"));
        // Each rank's memory timeline, rank 0's under the usual name.
        EXPECT_TRUE(fs::exists(many + "/memory_timeline.json"));
        EXPECT_TRUE(fs::exists(fmt::format("{}/memory_timeline.rank-{}.json", many, c.world - 1)));
    }
}

TEST(TrainDataParallel, ATwoRankCheckpointResumesOnOneRankAtTheSameGlobalBatch) {
    TempDir tmp("sf_ddp_resume");
    const std::vector<std::string> flags = {"--max_train_steps",        "6",
                                            "--checkpointing_steps",    "3",
                                            "--resume_from_checkpoint", "latest"};
    const std::string whole = tmp.file("whole"), moved = tmp.file("moved");
    for (int s : run_ranks(2, train_args(whole, 2, flags), whole + ".log")) ASSERT_EQ(s, 0);
    // The same run stopped at its checkpoint of step 3, then resumed by one rank of batch 4.
    std::vector<std::string> first = flags;
    first[1] = "3";  // --max_train_steps 3
    for (int s : run_ranks(2, train_args(moved, 2, first), moved + ".log")) ASSERT_EQ(s, 0);
    ASSERT_TRUE(fs::exists(moved + "/checkpoint-3"));
    ASSERT_EQ(sf::test::wait_for(start_with(sf::test::kSanaflow, train_args(moved, 4, flags), {},
                                            moved + ".one.log")),
              0)
        << sf::test::read_file(moved + ".one.log");
    const std::vector<double> a = losses_in(whole), b = losses_in(moved);
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << i;
}

TEST(TrainDataParallel, ThreeRanksKilledAndResumedEndBitIdenticalToAnUninterruptedRun) {
    TempDir tmp("sf_ddp_kill");
    const std::vector<std::string> flags = {
        "--max_train_steps",        "10",     "--checkpointing_steps", "3",
        "--resume_from_checkpoint", "latest", "--caption_dropout",     "0.3"};
    const std::string whole = tmp.file("whole"), killed = tmp.file("killed");
    for (int s : run_ranks(3, train_args(whole, 1, flags), whole + ".log")) ASSERT_EQ(s, 0);

    std::vector<pid_t> pids;
    run_ranks(3, train_args(killed, 1, flags), killed + ".log", &pids);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline &&
           !fs::exists(killed + "/checkpoint-6/state.json")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(pids[2], SIGKILL);
    for (pid_t p : pids) sf::test::wait_for(p);  // the others stop: their rank 2 is gone
    ASSERT_FALSE(fs::exists(killed + "/training_summary.json")) << "the run ended before the kill";
    for (int s : run_ranks(3, train_args(killed, 1, flags), killed + ".resumed.log"))
        ASSERT_EQ(s, 0) << sf::test::read_file(killed + ".resumed.log.0");

    EXPECT_EQ(losses_in(killed), losses_in(whole));  // bit for bit
    EXPECT_EQ(sf::test::read_file(weights_of(killed, false)),
              sf::test::read_file(weights_of(whole, false)));
}

TEST(TrainDataParallel, ARankThatDiesMakesTheOthersStopNamingIt) {
    TempDir tmp("sf_ddp_dies");
    const std::string out = tmp.file("run");
    std::vector<pid_t> pids;
    run_ranks(2, train_args(out, 2, {"--max_train_steps", "100000", "--ddp_timeout", "30"}),
              out + ".log", &pids);
    // Once rank 0 has logged a step, rank 1 is killed.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline &&
           sf::test::read_file(out + "/metrics.jsonl").find("\"step\":2") == std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pids[1], SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    const int status = sf::test::wait_for(pids[0]);
    sf::test::wait_for(pids[1]);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    const std::string log = sf::test::read_file(out + ".log.0");
    ASSERT_TRUE(WIFEXITED(status)) << log;
    EXPECT_NE(WEXITSTATUS(status), 0) << log;
    EXPECT_NE(log.find("rank 1 stopped answering"), std::string::npos) << log;
    EXPECT_LT(seconds, 60.0) << "within --ddp_timeout (30 s) and the check of the heartbeats";
}

TEST(TrainCli, BadLaunchVariablesAndPrepUnderALauncherAreRefusedNamingThem) {
    TempDir tmp("sf_ddp_cli");
    const std::string out = tmp.file("run");
    auto run = [&](const std::vector<std::pair<std::string, std::string>>& env,
                   std::vector<std::string> args) {
        const int status =
            sf::test::wait_for(start_with(sf::test::kSanaflow, args, env, out + ".log"));
        return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                              sf::test::read_file(out + ".log"));
    };
    auto [code, log] = run({{"RANK", "0"}}, train_args(out, 2, {}));
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("WORLD_SIZE"), std::string::npos) << log;
    std::tie(code, log) = run({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, train_args(out, 2, {}));
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("rank 2 of a world of 2"), std::string::npos) << log;
    std::tie(code, log) = run({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_PORT", "x"}},
                              train_args(out, 2, {}));
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("MASTER_PORT=x"), std::string::npos) << log;
    sf::test::write_dataset(tmp.path() / "data", 0, 2);
    std::tie(code, log) = run({{"RANK", "0"}, {"WORLD_SIZE", "2"}},
                              {"sanaflow", "prep", "--instance_data_dir", tmp.file("data"),
                               "--cache_dir", tmp.file("cache")});
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("sharded prep is not built yet"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(tmp.file("cache") + "/data.mdb"));
}

// torchrun --no-python, as its documentation launches a program that is not Python: the ranks
// take its variables (and its agent's store on LibTorch 2.x).
TEST(TrainDataParallel, TorchrunLaunchesTheProgramAsItIs) {
    const std::string torchrun = std::string(SANAFLOW_SOURCE_DIR) + "/.venv/bin/torchrun";
    if (!fs::exists(torchrun)) GTEST_SKIP() << torchrun << " is missing: bash tools/setup.sh";
    TempDir tmp("sf_ddp_torchrun");
    const std::string one = tmp.file("one"), many = tmp.file("many");
    ASSERT_EQ(sf::test::wait_for(
                  start_with(sf::test::kSanaflow, train_args(one, 4, {}), {}, one + ".log")),
              0);
    std::vector<std::string> args = {"torchrun",
                                     "--nproc_per_node",
                                     "2",
                                     "--master_addr",
                                     "127.0.0.1",
                                     "--master_port",
                                     std::to_string(free_port()),
                                     "--no-python",
                                     sf::test::kSanaflow};
    const auto train = train_args(many, 2, {});
    args.insert(args.end(), train.begin() + 1, train.end());
    const int status = sf::test::wait_for(start_with(torchrun, args, {}, many + ".log"));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << sf::test::read_file(many + ".log");
    EXPECT_LT(weight_difference(weights_of(many, false), weights_of(one, false)), 1e-4);
}

}  // namespace
