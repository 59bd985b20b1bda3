// End to end: generated images -> prep -> train, through the library and the program: the loss
// falls, a run killed with SIGKILL and resumed ends exactly where an uninterrupted run does, LoRA
// saves adapters only, and a checkpoint made with other settings is refused.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/memory.h"
#include "integration_util.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/class_images.h"
#include "pipelines/train/report/tensorboard.h"
#include "pipelines/train/train.h"
#include "stages/train/train_data.h"
#include "stages/train/train_state.h"
#include "storage/cache.h"
#include "storage/fault_injection.h"
#include "storage/lmdb.h"
#include "storage/safetensors_file.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::TrainOptions;
using sf::test::kSanaflow;
using sf::test::losses_in;
using sf::test::mean;
using sf::test::TempDir;

// A prepped cache of `images` generated images, shared by the tests of this file.
const std::string& shared_cache(int images = 8) {
    static TempDir tmp("sf_train_cache");
    static const std::string cache = [&] {
        sf::test::write_dataset(tmp.path() / "data", 0, images);
        sf::pipelines::run_prep(sf::test::options_for(tmp));
        return tmp.file("cache");
    }();
    return cache;
}

TrainOptions train_options(const std::string& out) {
    TrainOptions o;
    o.rank = 0;  // every weight, no warmup: the library defaults are upstream's (LoRA, 500)
    o.lr_warmup_steps = 0;
    o.cache_dir = shared_cache();
    o.output_dir = out;
    o.max_train_steps = 30;
    o.train_batch_size = 2;
    o.learning_rate = 2e-3;
    o.checkpointing_steps = 0;
    o.log_every = 1000;
    return o;
}

TEST(TrainIntegration, TinyModelLowersItsLossWithoutLoadingAnEncoder) {
    TempDir out("sf_train_out");
    shared_cache();  // prep (and its encoders) before the marks are counted
    const size_t marks_before = sf::mem::memory_log().marks().size();
    auto o = train_options(out.file("run"));
    o.gradient_checkpointing = 1;
    o.attention = "chunked";
    o.caption_dropout = 0.2;
    o.blocks_to_swap = 1;  // the first block's weights lent for each run
    const auto report = sf::pipelines::run_train(o);
    ASSERT_EQ(report.losses.size(), 30u);
    const double first = mean(report.losses, 0, 5), last = mean(report.losses, 25, 30);
    EXPECT_LT(last, 0.8 * first) << "first " << first << " last " << last;
    // Neither encoder was loaded: no stage of theirs marked memory during training.
    const auto marks = sf::mem::memory_log().marks();
    for (size_t i = marks_before; i < marks.size(); ++i)
        EXPECT_EQ(marks[i].stage.rfind("encode_", 0), std::string::npos);
    EXPECT_TRUE(fs::exists(out.file("run/transformer/diffusion_pytorch_model.safetensors")));
    EXPECT_TRUE(fs::exists(out.file("run/transformer/config.json")));
    EXPECT_NE(report.phase_table.find("backward"), std::string::npos);
    // metrics.jsonl: a line per step, in order, with what a plot needs.
    const std::string metrics = sf::test::read_file(out.file("run/metrics.jsonl"));
    std::istringstream lines(metrics);
    std::string line;
    int64_t step = 0;
    while (std::getline(lines, line)) {
        const auto j = nlohmann::json::parse(line);
        EXPECT_EQ(j.at("step").get<int64_t>(), ++step);
        EXPECT_DOUBLE_EQ(j.at("loss").get<double>(), report.losses[static_cast<size_t>(step - 1)]);
        for (const char* key :
             {"lr", "grad_norm", "loss_scale", "step_seconds", "samples_per_second"})
            EXPECT_TRUE(j.at(key).is_number()) << key << " in " << line;
        EXPECT_GT(j.at("peak_bytes").at("backward").get<int64_t>(), 0) << line;
    }
    EXPECT_EQ(step, 30);
    // And TensorBoard events (read with TensorBoard itself in tests/python/ecosystem_test.py).
    EXPECT_FALSE(fs::is_empty(out.file("run/logs/sanaflow")));
}

// The saved transformer/ is a diffusers-layout model that training can start from again: its
// first loss is the trained model's, not a fresh one's; its config.json alone trains from scratch.
TEST(TrainIntegration, FineTunesFromItsOwnOutputAndTrainsFromAConfig) {
    TempDir out("sf_train_finetune");
    auto o = train_options(out.file("base"));
    o.max_train_steps = 40;
    const auto base = sf::pipelines::run_train(o);

    auto tune = train_options(out.file("tune"));
    tune.max_train_steps = 5;
    tune.pretrained_model_name_or_path = out.file("base");
    const auto tuned = sf::pipelines::run_train(tune);
    auto scratch = train_options(out.file("scratch"));
    scratch.max_train_steps = 5;
    scratch.transformer_config = out.file("base/transformer/config.json");
    const auto fresh = sf::pipelines::run_train(scratch);
    // The same seed draws the same batches and noise in both short runs.
    EXPECT_LT(mean(tuned.losses, 0, 5), 0.9 * mean(fresh.losses, 0, 5));
    EXPECT_NEAR(mean(fresh.losses, 0, 5), mean(base.losses, 0, 5),
                1e-9);  // seeded: the base run's start

    auto wrong = train_options(out.file("wrong"));
    wrong.pretrained_model_name_or_path = out.file("nothing-here");
    try {
        sf::pipelines::run_train(wrong);
        FAIL();
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("nothing-here"), std::string::npos) << e.what();
    }
}

TEST(TrainIntegration, KilledAndResumedRunEqualsAnUninterruptedOne) {
    TempDir out("sf_train_resume");
    auto args = [&](const std::string& dir) {
        return std::vector<std::string>{"sanaflow",
                                        "-q",
                                        "train",
                                        "--cache_dir",
                                        shared_cache(),
                                        "--output_dir",
                                        dir,
                                        "--max_train_steps",
                                        "16",
                                        "--train_batch_size",
                                        "2",
                                        "--learning_rate",
                                        "2e-3",
                                        "--checkpointing_steps",
                                        "4",
                                        "--caption_dropout",
                                        "0.3",
                                        "--resume_from_checkpoint",
                                        "latest"};
    };
    auto exec = sf::test::start_sanaflow;
    auto wait_exit = sf::test::wait_for;
    const std::string whole = out.file("whole"), killed = out.file("killed");
    ASSERT_EQ(wait_exit(exec(args(whole))), 0);

    // Killed once a checkpoint exists, then resumed from it.
    const pid_t child = exec(args(killed));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline &&
           !fs::exists(killed + "/checkpoint-8/state.json")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(child, SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(wait_exit(child))) << "the run ended before it could be killed";
    ASSERT_FALSE(fs::exists(killed + "/training_summary.json"));
    ASSERT_EQ(wait_exit(exec(args(killed))), 0);

    EXPECT_EQ(losses_in(killed), losses_in(whole));  // every step's loss, bit for bit
    const std::string weights = "/transformer/diffusion_pytorch_model.safetensors";
    EXPECT_EQ(sf::test::read_file(killed + weights), sf::test::read_file(whole + weights));
}

TEST(TrainIntegration, LoRASavesAdaptersOnlyAndResumeChecksSettings) {
    TempDir out("sf_train_lora");
    auto o = train_options(out.file("lora"));
    o.rank = 4;
    o.max_train_steps = 6;
    o.checkpointing_steps = 3;
    o.mixed_precision = "bf16";
    const auto report = sf::pipelines::run_train(o);
    const auto file = sf::storage::SafetensorsFile::open(report.weights_path);
    ASSERT_FALSE(file.names().empty());
    for (const auto& name : file.names()) {
        EXPECT_EQ(name.rfind("transformer.transformer_blocks.", 0), 0u) << name;
        EXPECT_TRUE(name.find(".lora_A.weight") != std::string::npos ||
                    name.find(".lora_B.weight") != std::string::npos)
            << name;
    }
    // A and B for q, k, v of both attentions (peft matches "to_q" in attn1 and attn2), 2 blocks.
    EXPECT_EQ(static_cast<int64_t>(file.names().size()), 2 * 6 * 2);
    // Each checkpoint holds the same file (a pipeline loads any checkpoint), in its manifest:
    // the last one's equals the final file, and damaging it fails the checkpoint's verification.
    EXPECT_EQ(file.metadata().at("format"), "pt");
    const std::string in_checkpoint =
        out.file("lora/checkpoint-3/pytorch_lora_weights.safetensors");
    const auto first = sf::storage::SafetensorsFile::open(in_checkpoint);
    EXPECT_EQ(first.names(), file.names());
    EXPECT_EQ(sf::test::read_file(out.file("lora/checkpoint-6/pytorch_lora_weights.safetensors")),
              sf::test::read_file(report.weights_path));
    EXPECT_NO_THROW(sf::train::verify_checkpoint(out.file("lora/checkpoint-3")));
    {
        std::string bytes = sf::test::read_file(in_checkpoint);
        bytes[bytes.size() - 1] ^= 1;
        sf::test::write_file(in_checkpoint, bytes);
    }
    EXPECT_THROW(sf::train::verify_checkpoint(out.file("lora/checkpoint-3")), sf::Error);

    o.rank = 8;
    o.max_train_steps = 9;
    o.resume_from_checkpoint = "latest";
    try {
        sf::pipelines::run_train(o);
        FAIL() << "resumed a rank-4 checkpoint with rank 8";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank: checkpoint has 4, run wants 8"),
                  std::string::npos)
            << e.what();
    }
}

// --lora_dropout (peft's lora_dropout): the adapters' input is dropped in training, so the steps
// differ from a run without it; its masks come from the generators a checkpoint keeps, so a
// resumed run ends bit-identical to an uninterrupted one; the rate is a setting of the checkpoint.
// --optimizer prodigy (stages/train/prodigy.h) on LoRA (whose B matrices start at zero: a
// scalar p0): a checkpoint holds the estimate and the per-parameter tensors and resumes
// bit-identically, another Prodigy setting and the fused pass are refused, and upstream's spelling
// of its flags parses. (Its arithmetic is held to prodigyopt's in stages_train_test.cpp.)
TEST(TrainIntegration, ProdigyTrainsAndResumesExactly) {
    TempDir out("sf_train_prodigy");
    auto o = train_options(out.file("whole"));
    o.rank = 4;
    o.optimizer = "prodigy";
    o.learning_rate = 1.0;
    o.max_train_steps = 6;
    o.checkpointing_steps = 3;
    const auto whole = sf::pipelines::run_train(o);
    ASSERT_EQ(whole.losses.size(), 6u);
    // The checkpoint holds Prodigy's state: the estimate (an fp64 scalar, d0 = 1e-6 or more),
    // and per parameter its tensors, p0 a scalar for LoRA's B (zero at the start) and whole for A.
    const auto saved =
        sf::storage::SafetensorsFile::open(out.file("whole/checkpoint-6/optimizer.safetensors"));
    const sf::storage::TensorData d = saved.read("optimizer.prodigy.d");
    ASSERT_EQ(d.bytes.size(), sizeof(double));
    double estimate = 0;
    std::memcpy(&estimate, d.bytes.data(), sizeof(double));
    EXPECT_GE(estimate, 1e-6);
    EXPECT_TRUE(std::isfinite(estimate));
    // Every step's d x lr is in metrics.jsonl (lr 1 here): the last one is the checkpoint's d.
    std::istringstream lines(sf::test::read_file(out.file("whole/metrics.jsonl")));
    std::vector<double> d_lr;
    for (std::string line; std::getline(lines, line);)
        d_lr.push_back(nlohmann::json::parse(line).at("prodigy_d_lr").get<double>());
    ASSERT_EQ(d_lr.size(), 6u);
    EXPECT_DOUBLE_EQ(d_lr.back(), estimate);
    int scalar_p0 = 0, whole_p0 = 0;
    for (const auto& name : saved.names()) {
        if (name.size() < 3 || name.compare(name.size() - 3, 3, ".p0") != 0) continue;
        const bool b = name.find("lora_B") != std::string::npos;
        const bool scalar = saved.read(name).shape.empty();
        EXPECT_EQ(scalar, b) << name;
        (scalar ? scalar_p0 : whole_p0) += 1;
    }
    EXPECT_EQ(scalar_p0, whole_p0);
    EXPECT_GT(scalar_p0, 0);

    const auto resumed = sf::test::train_stopped_and_resumed(o, out.file("split"), 3);
    EXPECT_EQ(resumed.losses, whole.losses);
    EXPECT_EQ(sf::test::read_file(resumed.weights_path), sf::test::read_file(whole.weights_path));
    auto other = o;  // another Prodigy: refused on resume
    other.output_dir = out.file("split");
    other.resume_from_checkpoint = "latest";
    other.prodigy_safeguard_warmup = false;
    other.max_train_steps = 8;
    sf::test::expect_error([&] { sf::pipelines::run_train(other); },
                           sf::ErrorCode::kInvalidArgument, "prodigy_safeguard_warmup");
    auto fused = o;
    fused.output_dir = out.file("fused");
    fused.fused_backward_pass = true;
    fused.max_grad_norm = 0;
    sf::test::expect_error([&] { sf::pipelines::run_train(fused); },
                           sf::ErrorCode::kInvalidArgument, "--optimizer prodigy");
    // Upstream's spelling on the command line: `type=bool` values, the name in any case.
    const auto cli = sf::test::run_command(
        kSanaflow + " train --cache_dir " + shared_cache() + " --output_dir " + out.file("cli") +
        " --optimizer Prodigy --learning_rate 1 --prodigy_decouple False "
        "--prodigy_use_bias_correction --prodigy_beta3 0.98 --max_train_steps 1 "
        "--checkpointing_steps 1 -q");
    EXPECT_EQ(cli.exit_code, 0) << cli.output;
    const auto state = sf::test::read_file(out.file("cli/checkpoint-1/state.json"));
    EXPECT_NE(state.find("\"prodigy_decouple\": \"false\""), std::string::npos) << state;
}

TEST(TrainIntegration, LoRADropoutChangesTheStepsAndResumesExactly) {
    TempDir out("sf_train_lora_dropout");
    auto o = train_options(out.file("whole"));
    o.rank = 4;
    o.lora_dropout = 0.3;
    o.max_train_steps = 4;
    o.checkpointing_steps = 2;
    const auto whole = sf::pipelines::run_train(o);
    auto plain = o;
    plain.lora_dropout = 0;
    plain.output_dir = out.file("plain");
    const auto without = sf::pipelines::run_train(plain);
    ASSERT_EQ(whole.losses.size(), 4u);
    // Step 1 is the same either way (lora_B starts at zero: the adapters add nothing yet).
    EXPECT_EQ(whole.losses[0], without.losses[0]);
    EXPECT_NE(whole.losses, without.losses) << "--lora_dropout changed nothing";

    const auto resumed = sf::test::train_stopped_and_resumed(o, out.file("split"), 2);
    EXPECT_EQ(resumed.losses, whole.losses);
    EXPECT_EQ(sf::test::read_file(resumed.weights_path), sf::test::read_file(whole.weights_path));

    auto split = o;
    split.output_dir = out.file("split");
    split.resume_from_checkpoint = "latest";
    split.lora_dropout = 0.1;
    split.max_train_steps = 6;
    sf::test::expect_error([&] { sf::pipelines::run_train(split); },
                           sf::ErrorCode::kInvalidArgument, "lora_dropout");
    auto full = train_options(out.file("full"));
    full.lora_dropout = 0.1;
    sf::test::expect_error([&] { sf::pipelines::run_train(full); }, sf::ErrorCode::kInvalidArgument,
                           "--lora_dropout");
    o.lora_dropout = 1.0;
    o.output_dir = out.file("one");
    sf::test::expect_error([&] { sf::pipelines::run_train(o); }, sf::ErrorCode::kInvalidArgument,
                           "--lora_dropout");
}

// --repeats with --num_train_epochs: an epoch is that many passes over the cache, so the run
// takes that many times the steps; the count is a setting of the checkpoint.
TEST(TrainIntegration, RepeatsMakeEachEpochThatManyPasses) {
    TempDir out("sf_train_repeats");
    auto o = train_options(out.file("once"));
    o.max_train_steps = 0;  // --num_train_epochs 1
    o.checkpointing_steps = 4;
    const auto once = sf::pipelines::run_train(o);
    EXPECT_EQ(once.losses.size(), 4u) << "8 samples in batches of 2";
    o.repeats = 3;
    o.output_dir = out.file("thrice");
    const auto thrice = sf::pipelines::run_train(o);
    EXPECT_EQ(thrice.losses.size(), 12u);
    o.repeats = 2;
    o.resume_from_checkpoint = "latest";
    sf::test::expect_error([&] { sf::pipelines::run_train(o); }, sf::ErrorCode::kInvalidArgument,
                           "repeats: checkpoint has 3");
}

TEST(TrainCli, HelpAndBadFlags) {
    auto help = sf::test::run_command(kSanaflow + " train --help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.output.find("--gradient_checkpointing"), std::string::npos);
    EXPECT_NE(help.output.find("--fused_backward_pass"), std::string::npos);
    auto fused_clip = sf::test::run_command(kSanaflow + " train --cache_dir " + shared_cache() +
                                            " --output_dir /tmp/sf_unused --fused_backward_pass");
    EXPECT_NE(fused_clip.exit_code, 0);
    EXPECT_NE(fused_clip.output.find("--max_grad_norm"), std::string::npos) << fused_clip.output;
    // A YAML config holds the same keys; a typed flag wins over the file; an unknown key is named.
    TempDir tmp("sf_train_yaml");
    sf::test::write_file(
        tmp.path() / "train.yaml",
        "# tiny run\ncache_dir: " + shared_cache() +
            "\nmax_train_steps: 5\nlearning_rate: 1e-3  # c\n"
            "gradient_checkpointing: true\nlora_target_modules: \"to_q,to_k\"\nrank: 2\n");
    auto yaml = sf::test::run_command(kSanaflow + " -q train --config " + tmp.file("train.yaml") +
                                      " --max_train_steps 2 --output_dir " + tmp.file("out"));
    EXPECT_EQ(yaml.exit_code, 0) << yaml.output;
    EXPECT_NE(yaml.output.find("trained 2 steps"), std::string::npos) << yaml.output;
    EXPECT_EQ(losses_in(tmp.file("out")).size(), 2u);
    sf::test::write_file(tmp.path() / "bad.yaml", "learning_rat: 1\n");
    auto bad = sf::test::run_command(kSanaflow + " train --config " + tmp.file("bad.yaml") +
                                     " --cache_dir " + shared_cache() + " --output_dir " +
                                     tmp.file("out2"));
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("learning_rat"), std::string::npos) << bad.output;

    auto no_cache = sf::test::run_command(
        kSanaflow + " train --cache_dir /nonexistent/cache --output_dir /tmp/sf_unused");
    EXPECT_NE(no_cache.exit_code, 0);
    EXPECT_NE(no_cache.output.find("/nonexistent/cache"), std::string::npos) << no_cache.output;
}

TEST(TrainCli, NonFiniteAndOutOfRangeNumbersAreRefusedNamingTheFlag) {
    const std::string base =
        kSanaflow + " train --cache_dir " + shared_cache() + " --output_dir /tmp/sf_unused_nan";
    for (const std::string flag :
         {"--learning_rate nan", "--learning_rate inf", "--adam_weight_decay nan",
          "--flow_shift nan", "--max_grad_norm nan", "--caption_dropout nan", "--lora_alpha nan",
          "--learning_rate -1", "--flow_shift 0", "--caption_dropout 1"}) {
        const auto r = sf::test::run_command(base + " " + flag);
        EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.output;
        const std::string name = flag.substr(0, flag.find(' '));
        EXPECT_NE(r.output.find(name + " must be a finite number"), std::string::npos)
            << flag << ": " << r.output;
    }
    for (const std::string flag : {"--max_train_steps 99999999999999999999", "--seed -1",
                                   "--max_train_steps 1.5", "--rank -2"}) {
        const auto r = sf::test::run_command(base + " " + flag);
        EXPECT_NE(r.exit_code, 0) << flag << ": " << r.output;
        EXPECT_NE(r.output.find(flag.substr(0, flag.find(' '))), std::string::npos)
            << flag << ": " << r.output;
        EXPECT_EQ(r.output.find("9223372036854775807"), std::string::npos) << r.output;
    }
    EXPECT_FALSE(fs::exists("/tmp/sf_unused_nan/transformer"));
}

TEST(TrainIntegration, ADivergingRunStopsNamingTheStepAndKeepsItsLastCheckpoint) {
    TempDir out("sf_train_nan");
    TrainOptions o = train_options(out.path().string());
    o.learning_rate = 1e30;  // finite, and far past what any weight survives
    o.max_grad_norm = 0;
    o.checkpointing_steps = 1;
    try {
        sf::pipelines::run_train(o);
        FAIL() << "a run whose loss became non-finite finished";
    } catch (const sf::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("non-finite at step 2"), std::string::npos) << m;
        EXPECT_NE(m.find("the last good checkpoint is " + out.file("checkpoint-")),
                  std::string::npos)
            << m;
    }
    EXPECT_FALSE(fs::exists(out.path() / "transformer"));
    // Every checkpoint kept holds finite weights.
    for (const auto& entry : fs::directory_iterator(out.path())) {
        if (entry.path().filename().string().rfind("checkpoint-", 0) != 0) continue;
        for (const auto& [name, t] : sf::train::load_checkpoint(entry.path().string()).trainable) {
            EXPECT_TRUE(t.isfinite().all().item<bool>()) << entry.path() << " " << name;
        }
    }
}

TEST(TrainIntegration, AFullDiskAtTheFinalWeightsLosesNoTraining) {
    namespace faults = sf::storage::faults;
    TempDir out("sf_train_final"), whole("sf_train_whole");
    TrainOptions o = train_options(out.path().string());
    o.max_train_steps = 6;
    {
        faults::ScopedFault full(
            faults::Fault{faults::Op::kWrite, ENOSPC, "diffusion_pytorch_model.safetensors"});
        try {
            sf::pipelines::run_train(o);
            FAIL() << "the final weights write did not fail";
        } catch (const sf::Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("disk full"), std::string::npos) << m;
            EXPECT_NE(m.find("the trained state is safe in " + out.file("checkpoint-6")),
                      std::string::npos)
                << m;
            EXPECT_NE(m.find("--resume_from_checkpoint latest"), std::string::npos) << m;
        }
    }
    EXPECT_FALSE(fs::exists(out.path() / "transformer" / "config.json"));
    // As the message says: rerun with --resume_from_checkpoint latest.
    o.resume_from_checkpoint = "latest";
    const auto resumed = sf::pipelines::run_train(o);
    EXPECT_EQ(resumed.first_step, 6);
    EXPECT_FALSE(fs::exists(out.path() / "checkpoint-6"));  // not asked for: gone once safe
    TrainOptions w = train_options(whole.path().string());
    w.max_train_steps = 6;
    sf::pipelines::run_train(w);
    const std::string weights = "transformer/diffusion_pytorch_model.safetensors";
    EXPECT_EQ(sf::test::read_file(out.path() / weights),
              sf::test::read_file(whole.path() / weights));
}

// A copy of the shared cache, to damage.
std::string copy_of_shared_cache(const TempDir& tmp) {
    const fs::path to = tmp.path() / "cache";
    fs::create_directories(to);
    fs::copy_file(fs::path(shared_cache()) / "data.mdb", to / "data.mdb");
    return to.string();
}

TEST(TrainIntegration, AKeyChangedBehindLmdbsBackIsFoundByVerifyAndRefusedByTrain) {
    TempDir tmp("sf_train_damage");
    const std::string cache_dir = copy_of_shared_cache(tmp);
    {
        // What a flipped byte in a B-tree page did: one latent now sits under another key.
        sf::storage::Cache cache = sf::storage::Cache::open(cache_dir);
        sf::storage::LMDBDb latents = cache.db("latents");
        cache.env()->write([&](sf::storage::LMDBTxn& txn) {
            sf::storage::LMDBCursor cursor(txn, latents);
            ASSERT_TRUE(cursor.first());
            std::string key(cursor.key()), frame(cursor.value());
            txn.del(latents, key);
            key[5] = key[5] == 'a' ? 'b' : 'a';
            txn.put(latents, key, frame);
        });
    }
    const auto verify = sf::test::run_command(kSanaflow + " inspect " + cache_dir + " --verify");
    EXPECT_NE(verify.exit_code, 0) << verify.output;
    EXPECT_NE(verify.output.find("corrupt (references)/"), std::string::npos) << verify.output;
    EXPECT_NE(verify.output.find("is missing"), std::string::npos) << verify.output;

    TempDir out("sf_train_damage_out");
    TrainOptions o = train_options(out.path().string());
    o.cache_dir = cache_dir;
    o.max_train_steps = 2;
    sf::test::expect_error([&] { sf::pipelines::run_train(o); }, sf::ErrorCode::kCorruption,
                           "1 of 8 samples of the cache are damaged");
    o.skip_corrupt = true;
    const auto report = sf::pipelines::run_train(o);
    EXPECT_EQ(report.damaged_samples, 1);
    EXPECT_EQ(report.steps, 2);
}

TEST(TrainIntegration, ARecordDamagedInsideStopsTrainingUnlessSkippedThenItIsLeftOut) {
    TempDir tmp("sf_train_bitrot");
    const std::string cache_dir = copy_of_shared_cache(tmp);
    std::string damaged_key;
    {
        // The key and the references are intact, the frame is not: only decoding can tell.
        sf::storage::Cache cache = sf::storage::Cache::open(cache_dir);
        sf::storage::LMDBDb latents = cache.db("latents");
        cache.env()->write([&](sf::storage::LMDBTxn& txn) {
            sf::storage::LMDBCursor cursor(txn, latents);
            ASSERT_TRUE(cursor.first());
            damaged_key = std::string(cursor.key());
            std::string frame(cursor.value());
            frame[frame.size() / 2] = static_cast<char>(frame[frame.size() / 2] ^ 0x5a);
            txn.put(latents, damaged_key, frame);
        });
    }
    TempDir out("sf_train_bitrot_out");
    TrainOptions o = train_options(out.path().string());
    o.cache_dir = cache_dir;
    o.max_train_steps = 8;  // two epochs of 8 samples in batches of 2: the damaged one is drawn
    sf::test::expect_error([&] { sf::pipelines::run_train(o); }, sf::ErrorCode::kCorruption,
                           damaged_key);
    o.skip_corrupt = true;
    const auto report = sf::pipelines::run_train(o);
    EXPECT_EQ(report.damaged_samples, 1);
    EXPECT_EQ(report.steps, 8);
    const auto summary =
        nlohmann::json::parse(sf::test::read_file(out.path() / "training_summary.json"));
    EXPECT_EQ(summary.at("damaged_samples").get<int64_t>(), 1);
}

// --memory_snapshot records the CUDA caching allocator: on the CPU it is refused before any
// step, naming the flag and the file that has the CPU's memory instead.
TEST(TrainIntegration, MemorySnapshotOnTheCpuIsRefusedNamingTheFlag) {
    TempDir out("sf_train_snapshot");
    TrainOptions o = train_options(out.path().string());
    o.memory_snapshot = true;
    try {
        sf::pipelines::run_train(o);
        ADD_FAILURE() << "--memory_snapshot on the CPU was accepted";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        const std::string m = e.what();
        EXPECT_NE(m.find("--memory_snapshot"), std::string::npos) << m;
        EXPECT_NE(m.find("memory_timeline.json"), std::string::npos) << m;
    }
    EXPECT_FALSE(fs::exists(out.path() / "training_summary.json"));
}

TEST(TrainIntegration, ResumeRefusesAnotherCacheOrScheduleUnlessAllowed) {
    TempDir out("sf_train_data"), other("sf_train_other");
    TrainOptions o = train_options(out.path().string());
    o.max_train_steps = 2;
    o.checkpointing_steps = 2;
    o.lr_scheduler = "cosine";
    sf::pipelines::run_train(o);
    sf::test::write_dataset(other.path() / "data", 0, 4);  // other samples (4, not 8)
    sf::pipelines::run_prep(sf::test::options_for(other));
    TrainOptions resumed = o;
    resumed.max_train_steps = 4;
    resumed.resume_from_checkpoint = "latest";
    resumed.cache_dir = other.file("cache");
    try {
        sf::pipelines::run_train(resumed);
        FAIL() << "resumed on another cache";
    } catch (const sf::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("data_size: checkpoint has 8 samples"), std::string::npos) << m;
        EXPECT_NE(m.find("run wants 4 samples"), std::string::npos) << m;
        EXPECT_NE(m.find("max_train_steps: checkpoint has 2, run wants 4"), std::string::npos) << m;
        EXPECT_NE(m.find("--allow_new_data"), std::string::npos) << m;
    }
    resumed.allow_new_data = true;
    resumed.max_train_steps = 2;  // the cosine schedule's length must still match
    const auto report = sf::pipelines::run_train(resumed);
    EXPECT_EQ(report.first_step, 2);

    // An optimizer file without the random generators' states, in a checkpoint without a
    // manifest (as an earlier version wrote them): named, not `map::at`.
    const std::string checkpoint = out.file("checkpoint-2");
    const auto optimizer =
        sf::storage::SafetensorsFile::open(checkpoint + "/optimizer.safetensors");
    sf::storage::Record kept;
    for (const auto& name : optimizer.names()) {
        if (name.rfind("rng.", 0) != 0) kept.tensors[name] = optimizer.read(name);
    }
    sf::storage::write_safetensors_file(checkpoint + "/optimizer.safetensors", kept);
    fs::remove(checkpoint + "/manifest.json");
    TrainOptions no_rng = o;
    no_rng.resume_from_checkpoint = checkpoint;
    sf::test::expect_error([&] { sf::pipelines::run_train(no_rng); }, sf::ErrorCode::kCorruption,
                           checkpoint + "/optimizer.safetensors: no tensor rng.default");
}

TEST(TrainIntegration, ATrainingSetReadsSeveralCacheShards) {
    // Two shards as two ranks would write them: images 0-3 and 2-5 (2 and 3 in both).
    TempDir a("sf_shard_a"), b("sf_shard_b");
    sf::test::write_dataset(a.path() / "data", 0, 4);
    sf::test::write_dataset(b.path() / "data", 2, 4);
    sf::pipelines::run_prep(sf::test::options_for(a));
    sf::pipelines::run_prep(sf::test::options_for(b));
    const auto shard_a = sf::storage::Cache::open(a.file("cache"), false);
    const auto shard_b = sf::storage::Cache::open(b.file("cache"), false);
    const auto set =
        sf::train::TrainingSet::open(std::vector<sf::storage::Cache>{shard_a, shard_b});
    ASSERT_EQ(set.samples().size(), 6u);  // the two shared images once
    std::map<size_t, int> per_shard;
    for (const auto& s : set.samples()) ++per_shard[s.shard];
    EXPECT_EQ(per_shard, (std::map<size_t, int>{{0, 4}, {1, 2}}));
    // Every sample loads, each from its own shard.
    at::Generator gen = at::detail::createCPUGenerator(0);
    for (const auto& [bucket, indices] : set.buckets()) {
        const auto batch = set.load(indices, 0.0, gen);
        EXPECT_EQ(batch.latents.size(0), static_cast<int64_t>(indices.size()));
        const int64_t ratio =
            sf::model::AutoencoderDCConfig::named("dc-ae-tiny").spatial_compression_ratio();
        EXPECT_EQ(batch.latents.size(2) * ratio, bucket.height) << bucket.name();
        EXPECT_EQ(batch.latents.size(3) * ratio, bucket.width) << bucket.name();
    }
    EXPECT_EQ(sf::train::TrainingSet::open(shard_b).samples().size(), 4u);
}

// --config reads YAML with yaml-cpp: sections (their names are not part of a flag), lists (a
// flag's comma-separated value), null (the default), comments after apostrophes. A key that is no
// flag (a SimpleTuner-style file) is refused naming the file, its line and the key.
TEST(TrainCli, AYamlConfigWithSectionsListsAndNulls) {
    TempDir tmp("sf_train_yaml_nested");
    sf::test::write_file(tmp.path() / "train.yaml",
                         "# it's a tiny run\n"
                         "cache_dir: " +
                             shared_cache() +
                             "\n"
                             "optimization:\n"
                             "  max_train_steps: 2   # it's short\n"
                             "  learning_rate: 1e-3\n"
                             "  lr_warmup_steps: 0\n"
                             "lora:\n"
                             "  rank: 2\n"
                             "  lora_layers: [to_q, to_k]\n"
                             "resume_from_checkpoint: null\n");
    const auto ok = sf::test::run_command(kSanaflow + " train --config " + tmp.file("train.yaml") +
                                          " --output_dir " + tmp.file("out"));
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_NE(ok.output.find("trained 2 steps"), std::string::npos) << ok.output;
    const auto st = sf::storage::SafetensorsFile::open(
        tmp.file("out/pytorch_lora_weights.safetensors"), sf::storage::ChecksumPolicy::kRequire);
    const auto meta = nlohmann::json::parse(st.metadata().at("lora_adapter_metadata"));
    EXPECT_EQ(meta.at("transformer.r").get<int64_t>(), 2);
    EXPECT_EQ(meta.at("transformer.target_modules").get<std::vector<std::string>>(),
              (std::vector<std::string>{"to_q", "to_k"}));

    sf::test::write_file(tmp.path() / "simpletuner.yaml",
                         "learning_rate: 1e-4\nmodel_family: sana\nlora_type: standard\n");
    const auto foreign =
        sf::test::run_command(kSanaflow + " train --config " + tmp.file("simpletuner.yaml") +
                              " --cache_dir " + shared_cache());
    EXPECT_EQ(foreign.exit_code, 2) << foreign.output;
    EXPECT_NE(foreign.output.find("--model_family (" + tmp.file("simpletuner.yaml") + " line 2)"),
              std::string::npos)
        << foreign.output;
    EXPECT_NE(foreign.output.find("--lora_type (" + tmp.file("simpletuner.yaml") + " line 3)"),
              std::string::npos)
        << foreign.output;
    sf::test::write_file(tmp.path() / "broken.yaml", "learning_rate: [1e-4\n");
    const auto broken = sf::test::run_command(kSanaflow + " train --config " +
                                              tmp.file("broken.yaml") + " --cache_dir x");
    EXPECT_EQ(broken.exit_code, 2) << broken.output;
    EXPECT_NE(broken.output.find(tmp.file("broken.yaml") + " line"), std::string::npos)
        << broken.output;
}

// Every flag sanaflow shares with diffusers' train_dreambooth_lora_sana.py (v0.33.1) defaults to
// what that script's argparse says, where the meaning is the same. The CLI binds the flags to
// default-constructed options, so these are the command's defaults.
TEST(TrainCli, DefaultsAreUpstreamsWhereTheMeaningIsTheSame) {
    const TrainOptions t;
    const sf::pipelines::PrepOptions p;
    const sf::pipelines::ClassImageOptions k;
    struct Row {
        const char* flag;
        double ours, upstream;
    };
    const Row rows[] = {
        {"--rank", static_cast<double>(t.rank), 4},
        {"--lora_alpha", t.lora_alpha, 4},
        {"--lora_dropout", t.lora_dropout, 0.0},
        {"--learning_rate", t.learning_rate, 1e-4},
        {"--lr_warmup_steps", static_cast<double>(t.lr_warmup_steps), 500},
        {"--lr_num_cycles", static_cast<double>(t.lr_num_cycles), 1},
        {"--lr_power", t.lr_power, 1.0},
        {"--adam_beta1", t.adam_beta1, 0.9},
        {"--adam_beta2", t.adam_beta2, 0.999},
        {"--adam_weight_decay", t.adam_weight_decay, 1e-4},
        {"--adam_epsilon", t.adam_epsilon, 1e-8},
        {"--max_grad_norm", t.max_grad_norm, 1.0},
        {"--train_batch_size", static_cast<double>(t.train_batch_size), 4},
        {"--num_train_epochs", static_cast<double>(t.num_train_epochs), 1},
        {"--repeats", static_cast<double>(t.repeats), 1},
        {"--gradient_accumulation_steps", static_cast<double>(t.gradient_accumulation_steps), 1},
        {"--checkpointing_steps", static_cast<double>(t.checkpointing_steps), 500},
        {"--resolution", static_cast<double>(p.resolution), 512},
        {"--num_validation_images", static_cast<double>(t.num_validation_images), 4},
        {"--validation_epochs", static_cast<double>(t.validation_epochs), 50},
        {"--num_class_images", static_cast<double>(k.num_class_images), 100},
        {"--prior_loss_weight", t.prior_loss_weight, 1.0},
        {"--sample_batch_size", static_cast<double>(k.sample_batch_size), 4},
    };
    for (const Row& r : rows) EXPECT_EQ(r.ours, r.upstream) << r.flag;
    // Strings and switches.
    EXPECT_EQ(t.lr_scheduler, "constant");
    EXPECT_EQ(t.weighting_scheme, "none");
    EXPECT_EQ(t.logit_mean, 0.0);
    EXPECT_EQ(t.logit_std, 1.0);
    EXPECT_EQ(t.mode_scale, 1.29);
    EXPECT_EQ(t.output_dir, "sana-dreambooth-lora");
    EXPECT_EQ(t.lora_target_modules, "to_q,to_k,to_v");  // upstream: None -> to_k, to_q, to_v
    EXPECT_EQ(t.max_train_steps, 0);                     // upstream: None -> the epochs
    EXPECT_FALSE(t.scale_lr);
    EXPECT_FALSE(t.allow_tf32);
    EXPECT_EQ(t.gradient_checkpointing, 0);
    EXPECT_TRUE(t.resume_from_checkpoint.empty());
    EXPECT_EQ(t.report_to, "tensorboard");
    EXPECT_EQ(t.logging_dir, "logs");
    EXPECT_TRUE(t.validation_prompts.empty());  // upstream: None, no validation
    EXPECT_FALSE(t.validation_vae_tiling);
}

// A resumed run trains the steps after its checkpoint again: metrics.jsonl keeps each step once
// (the earlier run's lines past the checkpoint dropped, a torn last line too), in order.
TEST(TrainIntegration, MetricsHoldEachStepOnceAcrossAResume) {
    TempDir out("sf_train_metrics");
    auto o = train_options(out.file("run"));
    o.max_train_steps = 6;
    o.checkpointing_steps = 3;
    sf::pipelines::run_train(o);
    const std::string path = out.file("run/metrics.jsonl");
    sf::test::write_file(path, sf::test::read_file(path) + "{\"step\": 7, \"lo");  // torn
    o.resume_from_checkpoint = out.file("run/checkpoint-3");
    const auto resumed = sf::pipelines::run_train(o);
    std::istringstream lines(sf::test::read_file(path));
    std::vector<int64_t> steps;
    std::vector<double> losses;
    for (std::string line; std::getline(lines, line);) {
        const auto j = nlohmann::json::parse(line);
        steps.push_back(j.at("step").get<int64_t>());
        losses.push_back(j.at("loss").get<double>());
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(losses, resumed.losses);  // steps 4-6 are the resumed run's
}

// `sanaflow plot` draws metrics.jsonl into three panels (loss, learning rate, peak memory): each
// holds its curves' colours; without metrics it names the file.
TEST(TrainCli, PlotDrawsTheMetricsIntoAPng) {
    TempDir tmp("sf_plot");
    std::string lines;
    for (int step = 1; step <= 50; ++step) {
        lines += fmt::format(
            "{{\"step\": {}, \"loss\": {}, \"lr\": {}, \"peak_bytes\": {{\"forward\": {}, "
            "\"backward\": {}}}}}\n",
            step, 1.0 / step, 1e-4 * step / 50, 100 << 20, (150 + step) << 20);
    }
    sf::test::write_file(tmp.path() / "metrics.jsonl", lines + "{\"step\": 51, \"lo");  // torn
    const auto r = sf::test::run_command(kSanaflow + " plot " + tmp.path().string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const cv::Mat png = cv::imread(tmp.file("metrics.png"));
    ASSERT_FALSE(png.empty());
    EXPECT_EQ(png.cols, 960);
    EXPECT_EQ(png.rows, 3 * 260);
    // Every panel has drawn (non-grey) pixels: curves, not only axes and text.
    for (int panel = 0; panel < 3; ++panel) {
        const cv::Mat part = png.rowRange(panel * 260 + 30, panel * 260 + 230).colRange(91, 939);
        int coloured = 0;
        for (int y = 0; y < part.rows; ++y) {
            for (int x = 0; x < part.cols; ++x) {
                const cv::Vec3b p = part.at<cv::Vec3b>(y, x);
                if (std::max({p[0], p[1], p[2]}) - std::min({p[0], p[1], p[2]}) > 60) ++coloured;
            }
        }
        EXPECT_GT(coloured, 100) << "panel " << panel;
    }
    const auto none = sf::test::run_command(kSanaflow + " plot " + tmp.file("nowhere"));
    EXPECT_EQ(none.exit_code, 2) << none.output;
    fs::create_directories(tmp.path() / "empty");
    const auto empty = sf::test::run_command(kSanaflow + " plot " + tmp.file("empty"));
    EXPECT_EQ(empty.exit_code, 2) << empty.output;
    EXPECT_NE(empty.output.find("metrics.jsonl"), std::string::npos) << empty.output;
}

// TFRecord's checksum is CRC-32C; its check value (the CRC of "123456789") is 0xE3069283.
TEST(TensorBoard, EventFilesAreChecksummedRecords) {
    EXPECT_EQ(sf::pipelines::crc32c("123456789", 9), 0xE3069283u);
    EXPECT_EQ(sf::pipelines::crc32c("", 0), 0u);
    TempDir tmp("sf_tensorboard");
    std::string path;
    {
        sf::pipelines::TensorBoardWriter w(tmp.file("logs"));
        w.add_scalars(1, {{"loss", 0.5}});
        path = w.path();
    }
    EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
    // Two records (the version, one step), each length | crc | data | crc, all checksums right.
    const std::string bytes = sf::test::read_file(path);
    size_t at = 0, records = 0;
    while (at < bytes.size()) {
        uint64_t length = 0;
        uint32_t length_crc = 0, data_crc = 0;
        ASSERT_LE(at + 12, bytes.size());
        std::memcpy(&length, bytes.data() + at, 8);
        std::memcpy(&length_crc, bytes.data() + at + 8, 4);
        ASSERT_LE(at + 12 + length + 4, bytes.size());
        std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
        auto masked = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
        EXPECT_EQ(length_crc, masked(sf::pipelines::crc32c(bytes.data() + at, 8)));
        EXPECT_EQ(data_crc, masked(sf::pipelines::crc32c(bytes.data() + at + 12, length)));
        at += 12 + length + 4;
        ++records;
    }
    EXPECT_EQ(records, 2u);
    EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
}

// The launch line of the Sana OOM guide, typed after `sanaflow train` as the guide spells it (the
// built-in tiny models stand in for ./pretrained/sana): prep into OUTPUT_DIR/cache, then LoRA
// training (upstream's default) over one epoch. Where this LibTorch has no fp16 on the CPU the
// refusal names the flag before anything runs, and the same line runs with bf16.
TEST(TrainCli, TheGuidesLaunchLineRunsAsOneCommand) {
    TempDir tmp("sf_guide");
    sf::test::write_dataset(tmp.path() / "my_images", 0, 6);
    const std::string out = tmp.file("out");
    const std::string rest =
        " --gradient_checkpointing --offload --instance_data_dir " + tmp.file("my_images") +
        " --instance_prompt \"photo of my pet\" --train_batch_size 2 "
        "--gradient_accumulation_steps 4 --cache_latents --allow_tf32 --lr_scheduler cosine "
        "--learning_rate 5e-5 --output_dir " +
        out;
    std::string precision = " --mixed_precision fp16";
    auto r = sf::test::run_command(kSanaflow + " train" + precision + rest);
    if (r.exit_code != 0 &&
        r.output.find("--mixed_precision fp16: this LibTorch has no") != std::string::npos) {
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_FALSE(fs::exists(out + "/cache")) << "refused after work began";
        EXPECT_FALSE(fs::exists(out + "/memory_timeline.json")) << "a refused run's timeline";
        precision = " --mixed_precision bf16";
        r = sf::test::run_command(kSanaflow + " train" + precision + rest);
    }
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("6 written"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("trained 1 steps"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(out + "/cache"));
    EXPECT_TRUE(fs::exists(out + "/pytorch_lora_weights.safetensors")) << "LoRA by default";
    EXPECT_FALSE(fs::exists(out + "/transformer"));
    EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));
    EXPECT_TRUE(fs::exists(out + "/metrics.png")) << "the plot is written at the end";
    // The memory timeline of the whole job (prep's phases and models, then the steps) in
    // OUTPUT_DIR, and prep's alone in the cache; both drawn by `sanaflow plot`.
    auto spans_of = [](const std::string& path) {
        std::map<std::string, std::set<std::string>> lanes;  // lane -> span names
        std::ifstream in(path);
        const nlohmann::json trace = nlohmann::json::parse(in);
        for (const auto& e : trace.at("traceEvents"))
            if (e.at("ph") == "X") lanes[e.at("cat")].insert(e.at("name").get<std::string>());
        return lanes;
    };
    const auto job = spans_of(out + "/memory_timeline.json");
    for (const char* name : {"index", "text", "image"})
        EXPECT_TRUE(job.at("prep").count(name)) << name;
    for (const char* name : {"encode_text", "encode_vae"})
        EXPECT_TRUE(job.at("models").count(name)) << name;
    for (const char* name :
         {"step 1", "step 1 data", "step 1 forward", "step 1 backward", "step 1 optimizer"})
        EXPECT_TRUE(job.at("train").count(name)) << name;
    const auto prep_only = spans_of(out + "/cache/memory_timeline.json");
    EXPECT_TRUE(prep_only.at("prep").count("image"));
    EXPECT_FALSE(prep_only.count("train"));
    EXPECT_FALSE(cv::imread(out + "/memory_timeline.png").empty());
    const auto plot = sf::test::run_command(kSanaflow + " plot " + out + "/cache");
    EXPECT_EQ(plot.exit_code, 0) << plot.output;
    EXPECT_FALSE(cv::imread(out + "/cache/memory_timeline.png").empty()) << plot.output;
    // Again: the prep part finds everything cached and loads no encoder.
    auto again = sf::test::run_command(kSanaflow + " train" + precision + rest);
    EXPECT_EQ(again.exit_code, 0) << again.output;
    EXPECT_NE(again.output.find("6 already cached, 0 written"), std::string::npos) << again.output;
    // Without data or a cache: one line saying what to give.
    auto none = sf::test::run_command(kSanaflow + " train --output_dir " + out + "/refused");
    EXPECT_EQ(none.exit_code, 2);
    EXPECT_NE(none.output.find("give --cache_dir"), std::string::npos) << none.output;
    EXPECT_FALSE(fs::exists(out + "/refused")) << "the refused run left a folder";
}

// Upstream's flags that cannot apply are refused with one line each saying why; unknown flags are
// named all at once (not their values) with the nearest spelling; --version says what was built.
TEST(TrainCli, RefusedAndUnknownFlagsAreNamedAllAtOnce) {
    auto hub = sf::test::run_command(kSanaflow +
                                     " train --push_to_hub --hub_model_id me/pet --cache_dir x");
    EXPECT_EQ(hub.exit_code, 2);
    EXPECT_NE(hub.output.find("--push_to_hub: sanaflow does not upload"), std::string::npos)
        << hub.output;
    EXPECT_NE(hub.output.find("--hub_model_id: sanaflow does not upload"), std::string::npos)
        << hub.output;
    auto unknown = sf::test::run_command(
        kSanaflow + " train --cache_dir x --learning_rat 1e-4 --gradient_checkpoint --zzz 7");
    EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
    EXPECT_NE(unknown.output.find("--learning_rat (did you mean --learning_rate?)"),
              std::string::npos)
        << unknown.output;
    EXPECT_NE(unknown.output.find("--gradient_checkpoint (did you mean --gradient_checkpointing?)"),
              std::string::npos)
        << unknown.output;
    EXPECT_NE(unknown.output.find("--zzz"), std::string::npos) << unknown.output;
    EXPECT_EQ(unknown.output.find("1e-4"), std::string::npos)
        << "values mixed in: " << unknown.output;
    auto version = sf::test::run_command(kSanaflow + " --version");
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_NE(version.output.find("LibTorch " TORCH_VERSION), std::string::npos) << version.output;
    // -q after the subcommand: only errors and the final result, no progress or info lines.
    TempDir tmp("sf_quiet");
    auto quiet =
        sf::test::run_command(kSanaflow + " train --cache_dir " + shared_cache() +
                              " --max_train_steps 1 --output_dir " + tmp.file("out") + " -q");
    EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
    EXPECT_NE(quiet.output.find("trained 1 steps"), std::string::npos) << quiet.output;
    EXPECT_EQ(quiet.output.find(" info]"), std::string::npos) << quiet.output;
    // --local_rank as torch.distributed.launch passes it (either spelling); the environment's
    // LOCAL_RANK wins, as upstream.
    for (const std::string flag : {"--local_rank 0", "--local-rank=0"}) {
        auto local =
            sf::test::run_command(kSanaflow + " train " + flag + " --cache_dir " + shared_cache() +
                                  " --max_train_steps 1 --output_dir " + tmp.file("local") + " -q");
        EXPECT_EQ(local.exit_code, 0) << flag << ": " << local.output;
    }
    auto env_wins = sf::test::run_command("LOCAL_RANK=0 " + kSanaflow +
                                          " train --local_rank 1 --cache_dir " + shared_cache() +
                                          " --max_train_steps 1 --output_dir " + tmp.file("env"));
    EXPECT_EQ(env_wins.exit_code, 0) << env_wins.output;
    EXPECT_NE(env_wins.output.find("--local_rank 1: LOCAL_RANK=0 wins"), std::string::npos)
        << env_wins.output;
    auto bogus = sf::test::run_command(kSanaflow + " bogus");
    EXPECT_EQ(bogus.exit_code, 2) << bogus.output;
}

}  // namespace
