// Data-parallel training through c10d (Gloo on 127.0.0.1), the ranks started as torchrun starts
// them (the variables set by hand, and torchrun itself where the project's venv has it): N ranks
// of micro-batch b train what one rank of micro-batch N*b trains, a 3-rank run killed on one rank
// resumes bit-identically, a 2-rank checkpoint resumes on one rank, and a rank that dies makes
// the others stop naming it. With the optimizer state sharded (ZeRO-1) all of it holds as well.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration_util.h"
#include "pipelines/prep/prep.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/safetensors_file.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::test::losses_in;
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
    const int port = sf::test::free_port();
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

std::string weights_of(const std::string& out, bool lora) {
    return out + (lora ? "/pytorch_lora_weights.safetensors"
                       : "/transformer/diffusion_pytorch_model.safetensors");
}

// Each step's d x lr of an --optimizer prodigy run, from its metrics.jsonl.
std::vector<double> prodigy_d_lr_in(const std::string& output_dir) {
    std::istringstream lines(sf::test::read_file(fs::path(output_dir) / "metrics.jsonl"));
    std::vector<double> out;
    for (std::string line; std::getline(lines, line);)
        out.push_back(nlohmann::json::parse(line).value("prodigy_d_lr", 0.0));
    return out;
}

const std::vector<std::string> kProdigy = {"--learning_rate",
                                           "1",
                                           "--prodigy_safeguard_warmup",
                                           "False",
                                           "--prodigy_use_bias_correction",
                                           "False",
                                           "--optimizer",
                                           "prodigy"};

std::vector<std::string> with(std::vector<std::string> flags, const std::string& flag) {
    flags.push_back(flag);
    return flags;
}

struct EqualityCase {
    std::string name;
    int world, batch;
    std::vector<std::string> flags;
    double loss_bound = 1e-5, weight_bound = 2e-4;
    bool lora = false;
};

// The output of one rank's run of `c`'s global batch and flags without --shard_optimizer_state (a
// sharded launch trains what the unsharded one rank trains), made once per batch and flags; ""
// when the run failed (its log printed).
std::string one_rank_reference(const EqualityCase& c, TempDir& tmp,
                               std::map<std::string, std::string>& made) {
    std::vector<std::string> unsharded;
    for (const auto& flag : c.flags)
        if (flag != "--shard_optimizer_state") unsharded.push_back(flag);
    std::string key;
    for (const auto& arg : train_args("", c.world * c.batch, unsharded)) key += arg + " ";
    if (made.count(key)) return made.at(key);
    const std::string one = tmp.file(c.name + " one");
    const int status = sf::test::wait_for(start_with(
        sf::test::kSanaflow, train_args(one, c.world * c.batch, unsharded), {}, one + ".log"));
    EXPECT_EQ(status, 0) << sf::test::read_file(one + ".log");
    return status == 0 ? made[key] = one : std::string();
}

TEST(TrainDataParallel, RanksOfPartBatchesTrainWhatOneRankWithTheWholeBatchTrains) {
    // The bounds are what summing the parts' gradients in another order leaves (measured: fp32
    // losses within 1e-7, weights within 6e-5 of the largest weight; LoRA's B, grown from zero
    // by AdamW's sign-like first steps, 9e-4); bf16 computes parts of another shape, so its
    // rounding differs, and by how much depends on the CPU's kernels (losses 2.4e-4, weights 3e-2
    // on an Intel CPU; losses 9.6e-3, weights 7.2e-2 on an AMD EPYC without AVX-512); the fused
    // pass updates each weight as its reduced gradient arrives (weights 4.6e-4).
    const std::vector<EqualityCase> cases = {
        {"full", 2, 2, {}},
        {"lora", 2, 2, {"--rank", "4"}, 1e-5, 3e-3, true},
        {"checkpointing, bf16, accumulation",
         2,
         2,
         {"--gradient_checkpointing", "--mixed_precision", "bf16", "--gradient_accumulation_steps",
          "2"},
         2e-2,
         0.15},
        {"fused backward", 2, 2, {"--fused_backward_pass", "--max_grad_norm", "0"}, 1e-5, 1e-3},
        {"3 ranks, a last batch smaller than the ranks", 3, 1, {"--max_train_steps", "5"}},
        // ZeRO-1: the same sums, each reduced to its owner; clipping hard makes the global norm
        // (added up over the ranks' shares) decide every update.
        {"ZeRO-1, clipped", 2, 2, {"--shard_optimizer_state", "--max_grad_norm", "0.01"}},
        {"ZeRO-1, LoRA", 2, 2, {"--shard_optimizer_state", "--rank", "4"}, 1e-5, 3e-3, true},
        {"ZeRO-1, fused backward",
         2,
         2,
         {"--shard_optimizer_state", "--fused_backward_pass", "--max_grad_norm", "0"},
         1e-5,
         1e-3},
        {"ZeRO-1, 3 ranks", 3, 1, {"--shard_optimizer_state", "--max_train_steps", "5"}},
        // Prodigy, with the switches under which its estimate moves within 3 steps: unsharded
        // every rank sums every gradient; ZeRO-1 adds up the ranks' shares of its two sums.
        {"Prodigy", 2, 2, kProdigy},
        {"ZeRO-1, Prodigy", 2, 2, with(kProdigy, "--shard_optimizer_state")},
    };
    TempDir tmp("sf_ddp_equal");
    std::map<std::string, std::string> references;  // ZeRO-1 cases share the unsharded ones'
    for (const EqualityCase& c : cases) {
        SCOPED_TRACE(c.name);
        const std::string one = one_rank_reference(c, tmp, references);
        ASSERT_FALSE(one.empty()) << "the one-rank reference run failed";
        const std::string many = tmp.file(c.name + " many");
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
        if (std::find(c.flags.begin(), c.flags.end(), "prodigy") != c.flags.end()) {
            // The estimate, which moves the weights too little to show in them yet: the same.
            const std::vector<double> da = prodigy_d_lr_in(one), db = prodigy_d_lr_in(many);
            ASSERT_EQ(da.size(), a.size());
            ASSERT_EQ(db.size(), da.size());
            EXPECT_GT(da.back(), 1.5e-6) << "the estimate did not move from d0";
            for (size_t i = 0; i < da.size(); ++i) EXPECT_NEAR(db[i], da[i], 1e-5 * da[i]) << i;
        }
        EXPECT_FALSE(fs::exists(many + "/checkpoint-1"));
        // Each rank's memory timeline, rank 0's under the usual name.
        EXPECT_TRUE(fs::exists(many + "/memory_timeline.json"));
        EXPECT_TRUE(fs::exists(fmt::format("{}/memory_timeline.rank-{}.json", many, c.world - 1)));
    }
}

// The optimizer-state bytes each rank keeps, from rank 0's log of the last gathered checkpoint.
std::vector<int64_t> state_bytes_per_rank(const std::string& log) {
    const std::string mark = "bytes per rank: ";
    const size_t at = log.rfind(mark);
    std::vector<int64_t> bytes;
    if (at == std::string::npos) return bytes;
    std::istringstream in(log.substr(at + mark.size(), log.find('\n', at) - at - mark.size()));
    for (std::string item; std::getline(in, item, ',');) bytes.push_back(std::stoll(item));
    return bytes;
}

TEST(TrainDataParallel, ATwoRankCheckpointResumesOnOneRankAtTheSameGlobalBatch) {
    TempDir tmp("sf_ddp_resume");
    const std::vector<std::string> flags = {"--max_train_steps",        "6",
                                            "--checkpointing_steps",    "3",
                                            "--resume_from_checkpoint", "latest"};
    std::vector<std::string> first = flags;
    first[1] = "3";  // --max_train_steps 3
    auto sharded = [](std::vector<std::string> f) {
        f.push_back("--shard_optimizer_state");
        return f;
    };
    auto ranks_ok = [](int world, const std::vector<std::string>& args, const std::string& log) {
        const auto status = run_ranks(world, args, log);
        for (int r = 0; r < world; ++r) {
            ASSERT_EQ(status[r], 0) << sf::test::read_file(fmt::format("{}.{}", log, r));
        }
    };
    auto one_ok = [](const std::vector<std::string>& args, const std::string& log) {
        ASSERT_EQ(sf::test::wait_for(start_with(sf::test::kSanaflow, args, {}, log)), 0)
            << sf::test::read_file(log);
    };
    const std::string whole = tmp.file("whole");
    ranks_ok(2, train_args(whole, 2, flags), whole + ".log");
    const std::vector<double> a = losses_in(whole);
    ASSERT_EQ(a.size(), 6u);
    auto expect_losses_of_whole = [&](const std::string& out) {
        const std::vector<double> b = losses_in(out);
        ASSERT_EQ(b.size(), 6u);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << i;
    };
    {
        SCOPED_TRACE("2 ranks to the checkpoint of step 3, then one rank of batch 4");
        const std::string moved = tmp.file("moved");
        ranks_ok(2, train_args(moved, 2, first), moved + ".log");
        ASSERT_TRUE(fs::exists(moved + "/checkpoint-3"));
        one_ok(train_args(moved, 4, flags), moved + ".one.log");
        expect_losses_of_whole(moved);
    }
    {
        // ZeRO-1's checkpoint holds the whole state (gathered on rank 0): one rank goes on.
        SCOPED_TRACE("2 ranks with ZeRO-1, then one rank");
        const std::string moved = tmp.file("zero");
        ranks_ok(2, train_args(moved, 2, sharded(first)), moved + ".log");
        one_ok(train_args(moved, 4, flags), moved + ".one.log");
        expect_losses_of_whole(moved);
        // Each rank kept about half of it.
        const auto bytes = state_bytes_per_rank(sf::test::read_file(moved + ".log.0"));
        ASSERT_EQ(bytes.size(), 2u) << sf::test::read_file(moved + ".log.0");
        const double total = static_cast<double>(bytes[0] + bytes[1]);
        std::printf("[ ddp     ] ZeRO-1 optimizer state per rank: %lld, %lld bytes\n",
                    static_cast<long long>(bytes[0]), static_cast<long long>(bytes[1]));
        EXPECT_GT(total, 0);
        for (int64_t b : bytes) EXPECT_LT(static_cast<double>(b), 0.55 * total);
    }
    {
        SCOPED_TRACE("one rank, then 2 ranks with ZeRO-1");
        const std::string moved = tmp.file("to zero");
        one_ok(train_args(moved, 4, first), moved + ".one.log");
        ranks_ok(2, train_args(moved, 2, sharded(flags)), moved + ".log");
        expect_losses_of_whole(moved);
    }
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
    // A sharded prep into a cache of one process, and one process into a sharded cache.
    sf::test::write_dataset(tmp.path() / "data", 0, 2);
    sf::pipelines::run_prep(sf::test::options_for(tmp));
    std::tie(code, log) = run({{"RANK", "0"}, {"WORLD_SIZE", "2"}},
                              {"sanaflow", "prep", "--instance_data_dir", tmp.file("data"),
                               "--cache_dir", tmp.file("cache")});
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("is a cache of one process"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(tmp.file("cache") + "/shard-00000-of-00002"));
    fs::create_directories(tmp.file("sharded") + "/shard-00000-of-00002");
    std::tie(code, log) = run({}, {"sanaflow", "prep", "--instance_data_dir", tmp.file("data"),
                                   "--cache_dir", tmp.file("sharded")});
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("holds the shards of a sharded prep"), std::string::npos) << log;
    // Training on a set of shards with one missing names it.
    std::tie(code, log) = run({}, train_args(out, 2, {"--cache_dir", tmp.file("sharded")}));
    EXPECT_NE(code, 0);
    EXPECT_NE(log.find("shard-00001-of-00002 is missing"), std::string::npos) << log;
}

// The names of the files in `dir` (class images are "<index>-<hash of the JPEG>.jpg").
std::set<std::string> file_names(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

// Prior preservation under a launch: the ranks generate the missing class images, each its share
// (index i on rank i mod 2), the same images one process makes; then they prep their shares into
// shards of OUTPUT_DIR/class_cache and train on the pairs.
TEST(TrainDataParallel, PriorPreservationUnderALaunchGeneratesEachRanksShareOfTheClassImages) {
    TempDir tmp("sf_ddp_prior");
    sf::test::write_dataset(tmp.path() / "data", 0, 4);
    auto args = [&](const std::string& classes, const std::string& out, int batch) {
        return std::vector<std::string>{
            "sanaflow", "train", "--instance_data_dir", tmp.file("data"), "--instance_prompt",
            "photo of sks pet", "--with_prior_preservation", "--class_data_dir", tmp.file(classes),
            "--class_prompt", "photo of a pet", "--num_class_images", "4",
            // One image per batch, so that each is computed alike
            // by one process and by the ranks, to the bit.
            "--sample_batch_size", "1", "--center_crop", "--max_train_steps", "2",
            "--train_batch_size", std::to_string(batch), "--validation_inference_steps", "2",
            "--lr_warmup_steps", "0", "--report_to", "none", "--ddp_timeout", "60", "--output_dir",
            tmp.file(out)};
    };
    // One process (global batch 2), then 2 ranks of 1 with an empty class folder.
    ASSERT_EQ(sf::test::wait_for(start_with(sf::test::kSanaflow, args("classes_one", "one", 2), {},
                                            tmp.file("one.log"))),
              0)
        << sf::test::read_file(tmp.file("one.log"));
    const auto status = run_ranks(2, args("classes_many", "many", 1), tmp.file("many.log"));
    for (int r = 0; r < 2; ++r)
        ASSERT_EQ(status[r], 0) << sf::test::read_file(tmp.file(fmt::format("many.log.{}", r)));
    const std::string log = sf::test::read_file(tmp.file("many.log.0"));
    EXPECT_NE(log.find("generating 4 of \"photo of a pet\""), std::string::npos) << log;
    EXPECT_NE(log.find("(2 ranks, 2 on this one)"), std::string::npos) << log;
    const std::set<std::string> made = file_names(tmp.file("classes_many"));
    EXPECT_EQ(made.size(), 4u);
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(std::count_if(
                      made.begin(), made.end(),
                      [&](const std::string& n) { return n.rfind(fmt::format("{}-", i), 0) == 0; }),
                  1)
            << "index " << i;
    }
    EXPECT_EQ(made, file_names(tmp.file("classes_one"))) << "the same JPEG bytes, so names";
    EXPECT_NE(log.find("4 class samples of 4 paired with 4 instance samples"), std::string::npos)
        << log;
    for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(
            fs::is_directory(tmp.file(fmt::format("many/class_cache/shard-0000{}-of-00002", r))));
    }
    EXPECT_EQ(losses_in(tmp.file("many")).size(), 2u);
    // Run again: every image is there, none is made.
    const auto again = run_ranks(2, args("classes_many", "again", 1), tmp.file("again.log"));
    for (int r = 0; r < 2; ++r)
        ASSERT_EQ(again[r], 0) << sf::test::read_file(tmp.file(fmt::format("again.log.{}", r)));
    EXPECT_EQ(sf::test::read_file(tmp.file("again.log.0")).find("generating"), std::string::npos);
    EXPECT_EQ(file_names(tmp.file("classes_many")), made);
}

// Every record key of `db` in `cache_dir`.
std::set<std::string> keys_of(const std::string& cache_dir, const char* db) {
    const auto cache = sf::storage::Cache::open(cache_dir, /*create=*/false);
    std::set<std::string> keys;
    sf::storage::CacheReader(cache, db).snapshot().for_each(
        [&](std::string_view key, std::string_view) { keys.emplace(key); });
    return keys;
}

std::vector<std::string> prep_args(const std::string& data, const std::string& cache) {
    return {"sanaflow",     "prep", "--instance_data_dir", data, "--cache_dir", cache,
            "--resolution", "512",  "--min_side",          "128"};
}

// Two ranks of `sanaflow prep` write two disjoint shards which together hold the records one
// process writes (each reject in one of them); inspect --verify covers both, training reads both,
// and a rerun finds every record cached.
TEST(PrepSharded, TwoRanksWriteDisjointShardsThatHoldWhatOneProcessWrites) {
    TempDir tmp("sf_prep_sharded");
    sf::test::write_dataset(tmp.path() / "data", 0, 12);
    sf::test::write_file(tmp.path() / "data" / "broken.png", "not an image");
    const std::string one = tmp.file("one"), sharded = tmp.file("sharded");
    ASSERT_EQ(sf::test::wait_for(start_with(sf::test::kSanaflow, prep_args(tmp.file("data"), one),
                                            {}, one + ".log")),
              0)
        << sf::test::read_file(one + ".log");
    const auto status = run_ranks(2, prep_args(tmp.file("data"), sharded), sharded + ".log");
    for (int r = 0; r < 2; ++r)
        ASSERT_EQ(status[r], 0) << sf::test::read_file(fmt::format("{}.log.{}", sharded, r));
    const std::string a = sharded + "/shard-00000-of-00002", b = sharded + "/shard-00001-of-00002";
    ASSERT_TRUE(fs::exists(a + "/data.mdb"));
    ASSERT_TRUE(fs::exists(b + "/data.mdb"));
    namespace schema = sf::storage::schema;
    for (const char* db : {schema::kSamplesDb, schema::kLatentsDb}) {
        SCOPED_TRACE(db);
        const auto whole = keys_of(one, db), first = keys_of(a, db), second = keys_of(b, db);
        std::set<std::string> both = first;
        both.insert(second.begin(), second.end());
        EXPECT_EQ(both, whole);
        EXPECT_EQ(both.size(), first.size() + second.size()) << "the shards are disjoint";
        EXPECT_FALSE(first.empty());
        EXPECT_FALSE(second.empty());
    }
    // The broken file is one shard's reject, not both's.
    const auto rejects = [](const std::string& dir) {
        return sf::storage::Cache::open(dir, /*create=*/false).rejects().size();
    };
    EXPECT_EQ(rejects(a) + rejects(b), 1u);

    const auto inspect = sf::test::run_command(std::string(sf::test::kSanaflow) + " inspect " +
                                               sharded + " --verify");
    EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
    EXPECT_NE(inspect.output.find("2 shards"), std::string::npos) << inspect.output;
    EXPECT_NE(inspect.output.find("verify: all 2 shards ok"), std::string::npos) << inspect.output;

    // One process trains on both shards an epoch as long as the one cache's (the same samples;
    // one shard alone would be half of it).
    const std::string from_one = tmp.file("train one"), from_shards = tmp.file("train shards");
    const std::vector<std::pair<std::string, std::string>> runs = {{one, from_one},
                                                                   {sharded, from_shards}};
    for (const auto& [cache, out] : runs) {
        ASSERT_EQ(sf::test::wait_for(start_with(
                      sf::test::kSanaflow,
                      train_args(out, 2, {"--cache_dir", cache, "--max_train_steps", "0"}), {},
                      out + ".log")),
                  0)
            << sf::test::read_file(out + ".log");
    }
    EXPECT_EQ(losses_in(from_shards).size(), losses_in(from_one).size());
    EXPECT_GE(losses_in(from_one).size(), 6u);

    // A rerun of the sharded prep finds every record cached.
    const auto again = run_ranks(2, prep_args(tmp.file("data"), sharded), sharded + ".again");
    for (int r = 0; r < 2; ++r) {
        const std::string log = sf::test::read_file(fmt::format("{}.again.{}", sharded, r));
        ASSERT_EQ(again[r], 0) << log;
        EXPECT_NE(log.find(" 0 samples written"), std::string::npos) << log;
    }
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
                                     std::to_string(sf::test::free_port()),
                                     "--no-python",
                                     sf::test::kSanaflow};
    const auto train = train_args(many, 2, {});
    args.insert(args.end(), train.begin() + 1, train.end());
    const int status = sf::test::wait_for(start_with(torchrun, args, {}, many + ".log"));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << sf::test::read_file(many + ".log");
    EXPECT_LT(weight_difference(weights_of(many, false), weights_of(one, false)), 1e-4);
}

// --nproc_per_node: the program starts its own ranks with torchrun's variables and trains what
// one rank of the whole batch trains; a rank that fails stops the run with its status, named.
TEST(TrainDataParallel, NprocPerNodeStartsTheRanksItself) {
    TempDir tmp("sf_ddp_nproc");
    const std::string one = tmp.file("one"), many = tmp.file("many");
    ASSERT_EQ(sf::test::wait_for(
                  start_with(sf::test::kSanaflow, train_args(one, 4, {}), {}, one + ".log")),
              0);
    const int status = sf::test::wait_for(start_with(
        sf::test::kSanaflow, train_args(many, 2, {"--nproc_per_node", "2"}), {}, many + ".log"));
    const std::string log = sf::test::read_file(many + ".log");
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
    EXPECT_NE(log.find("--nproc_per_node 2: ranks 0-1 on 127.0.0.1:"), std::string::npos) << log;
    EXPECT_LT(weight_difference(weights_of(many, false), weights_of(one, false)), 1e-4);

    const std::string bad = tmp.file("bad");
    const int failed = sf::test::wait_for(start_with(
        sf::test::kSanaflow,
        train_args(bad, 2, {"--nproc_per_node", "2", "--cache_dir", tmp.file("no cache")}), {},
        bad + ".log"));
    const std::string bad_log = sf::test::read_file(bad + ".log");
    EXPECT_TRUE(WIFEXITED(failed) && WEXITSTATUS(failed) != 0) << bad_log;
    EXPECT_NE(bad_log.find("--nproc_per_node: rank "), std::string::npos) << bad_log;

    // SIGTERM to the launching process reaches its ranks: a run of 100000 steps ends at once.
    const std::string stopped = tmp.file("stopped");
    const pid_t launcher =
        start_with(sf::test::kSanaflow,
                   train_args(stopped, 2, {"--nproc_per_node", "2", "--max_train_steps", "100000"}),
                   {}, stopped + ".log");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline &&
           sf::test::read_file(stopped + ".log").find("joined") == std::string::npos) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(launcher, SIGTERM);
    int stopped_status = 0;
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    pid_t done = 0;
    while (done == 0 && std::chrono::steady_clock::now() < deadline) {
        done = ::waitpid(launcher, &stopped_status, WNOHANG);
        if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (done == 0) ::kill(launcher, SIGKILL);
    ASSERT_EQ(done, launcher) << "the ranks did not stop\n"
                              << sf::test::read_file(stopped + ".log");
    EXPECT_FALSE(WIFEXITED(stopped_status) && WEXITSTATUS(stopped_status) == 0);
    EXPECT_FALSE(fs::exists(stopped + "/training_summary.json"));
    // The launcher returned only once its ranks were gone (a launcher that died alone would
    // leave them training): no process is left with this run's output folder in its arguments.
    std::vector<pid_t> left;
    for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::string cmdline = sf::test::read_file(entry.path() / "cmdline");
        std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
        if (cmdline.find(stopped + " ") != std::string::npos) left.push_back(std::stoi(name));
    }
    for (pid_t p : left) ::kill(p, SIGKILL);
    EXPECT_TRUE(left.empty()) << left.size() << " ranks were left running";
}

}  // namespace
