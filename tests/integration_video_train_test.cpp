// Training on video windows (issue: video training): generated clips -> prep through the Wan VAE
// -> train. The cache's [C, f, h, w] latents select the SANA-Video transformer; its loss falls;
// its weights and config are saved in diffusers' layout; LoRA adapters carry diffusers' SANA-Video
// keys and leave the base untouched; a resumed run ends where an uninterrupted one does;
// validation writes videos; an image transformer's config on a video cache is refused naming both.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <thread>

#include "core/error.h"
#include "integration_util.h"
#include "model/common/weights.h"
#include "model/sana/sana_config.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "stages/video/decode_video.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::TrainOptions;
using sf::test::mean;
using sf::test::TempDir;

// Two 2-second clips at 8 fps (16 frames each: three 5-frame chunk windows per clip) in `dir`.
void write_clips(const fs::path& dir) {
    fs::create_directories(dir);
    sf::test::make_clip(dir / "a.mp4", 2.0, 8, "libx264", "-pix_fmt yuv420p");
    sf::test::write_file(dir / "a.txt", "a test pattern");
    sf::test::make_clip(dir / "b.webm", 2.0, 8, "libvpx-vp9");
    sf::test::write_file(dir / "b.txt", "another test pattern");
}

const std::string& video_cache() {
    static TempDir tmp("sf_video_train_cache");
    static const std::string cache = [&] {
        write_clips(tmp.path() / "data");
        sf::pipelines::run_prep(sf::test::video_options(tmp));
        return tmp.file("cache");
    }();
    return cache;
}

// The clips of video_cache() beside four images, through the same VAE (one-frame windows).
const std::string& joint_cache() {
    static TempDir tmp("sf_joint_train_cache");
    static const std::string cache = [&] {
        sf::test::write_dataset(tmp.path() / "data", 0, 4);
        write_clips(tmp.path() / "data");
        sf::pipelines::run_prep(sf::test::video_options(tmp));
        return tmp.file("cache");
    }();
    return cache;
}

TrainOptions video_train_options(const std::string& out) {
    TrainOptions o;
    o.rank = 0;  // every weight, no warmup: the library defaults are upstream's (LoRA, 500)
    o.lr_warmup_steps = 0;
    o.cache_dir = video_cache();
    o.output_dir = out;
    o.max_train_steps = 30;
    o.train_batch_size = 2;
    o.learning_rate = 2e-3;
    o.checkpointing_steps = 0;
    o.log_every = 1000;
    return o;
}

std::map<std::string, at::Tensor> tensors_of(const std::string& path) {
    const auto file = sf::storage::SafetensorsFile::open(path);
    std::map<std::string, at::Tensor> out;
    for (const auto& name : file.names())
        out[name] = sf::storage::from_tensor_data(file.read(name));
    return out;
}

TEST(TrainVideoIntegration, TinyVideoTransformerLowersItsLossAndSavesDiffusersLayout) {
    REQUIRE_FFMPEG();
    TempDir out("sf_video_train");
    const auto report = sf::pipelines::run_train(video_train_options(out.file("run")));
    ASSERT_EQ(report.losses.size(), 30u);
    const double first = mean(report.losses, 0, 5), last = mean(report.losses, 25, 30);
    EXPECT_LT(last, 0.8 * first) << "first " << first << " last " << last;

    const auto config = nlohmann::json::parse(
        sf::test::read_file(out.path() / "run" / "transformer" / "config.json"));
    EXPECT_EQ(config.at("_class_name"), "SanaVideoTransformer3DModel");
    EXPECT_EQ(config.at("patch_size"), nlohmann::json::array({1, 2, 2}));
    const auto weights = tensors_of(report.weights_path);
    ASSERT_TRUE(weights.count("patch_embedding.weight"));
    EXPECT_EQ(weights.at("patch_embedding.weight").dim(), 5);
    EXPECT_TRUE(weights.count("transformer_blocks.1.ff.conv_temp.weight"));
    EXPECT_TRUE(weights.count("transformer_blocks.0.attn1.norm_q.weight"));
}

TEST(TrainVideoIntegration, LoRAHasDiffusersKeysAndResumesExactly) {
    REQUIRE_FFMPEG();
    TempDir out("sf_video_lora");
    auto o = video_train_options(out.file("whole"));
    o.rank = 4;
    o.max_train_steps = 6;
    o.checkpointing_steps = 3;
    const auto whole = sf::pipelines::run_train(o);
    const auto adapters = tensors_of(whole.weights_path);
    // A and B for q, k, v of both attentions, 2 blocks; peft's names as diffusers' SANA-Video
    // LoRA loader reads them.
    EXPECT_EQ(adapters.size(), 2u * 6 * 2);
    EXPECT_TRUE(adapters.count("transformer.transformer_blocks.0.attn1.to_q.lora_A.weight"));
    EXPECT_TRUE(adapters.count("transformer.transformer_blocks.1.attn2.to_v.lora_B.weight"));

    // Stopped after its checkpoint at step 3 and resumed: the same adapters, bit for bit.
    const auto resumed = sf::test::train_stopped_and_resumed(o, out.file("split"), 3);
    EXPECT_EQ(resumed.losses, whole.losses);
    const auto again = tensors_of(resumed.weights_path);
    for (const auto& [name, t] : adapters) {
        ASSERT_TRUE(again.count(name)) << name;
        EXPECT_TRUE(at::equal(again.at(name), t)) << name;
    }
}

// SANA-Video's trainer: every 3rd step an image batch, image-to-video half the time, timestep
// chunks; a run killed with SIGKILL after a checkpoint resumes both samplers, and ends with the
// losses and weights of an uninterrupted run.
TEST(TrainVideoIntegration, JointTrainingAlternatesAndAKilledRunResumesBothSamplers) {
    REQUIRE_FFMPEG();
    TempDir out("sf_joint_train");
    auto args = [&](const std::string& dir) {
        return std::vector<std::string>{"sanaflow",    "-q",
                                        "train",       "--cache_dir",
                                        joint_cache(), "--output_dir",
                                        dir,           "--max_train_steps",
                                        "12",          "--train_batch_size",
                                        "1",           "--learning_rate",
                                        "2e-3",        "--joint_training_interval",
                                        "3",           "--i2v_probability",
                                        "0.5",         "--chunk_index",
                                        "0,1",         "--checkpointing_steps",
                                        "4",           "--resume_from_checkpoint",
                                        "latest"};
    };
    auto summary = [](const std::string& dir) {
        return nlohmann::json::parse(sf::test::read_file(fs::path(dir) / "training_summary.json"));
    };
    const std::string whole = out.file("whole"), killed = out.file("killed");
    ASSERT_EQ(sf::test::wait_for(sf::test::start_sanaflow(args(whole))), 0);
    const auto frames = summary(whole).at("batch_frames_of_this_run").get<std::vector<int64_t>>();
    ASSERT_EQ(frames.size(), 12u);
    for (size_t s = 0; s < frames.size(); ++s) {
        if (s > 0 && s % 3 == 0) {
            EXPECT_EQ(frames[s], 1) << "step " << s + 1 << " should be an image batch";
        } else {
            EXPECT_GT(frames[s], 1) << "step " << s + 1 << " should be a video batch";
        }
    }

    const pid_t child = sf::test::start_sanaflow(args(killed));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline &&
           !fs::exists(killed + "/checkpoint-8/state.json")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(child, SIGKILL);
    ASSERT_TRUE(WIFSIGNALED(sf::test::wait_for(child))) << "the run ended before it was killed";
    ASSERT_EQ(sf::test::wait_for(sf::test::start_sanaflow(args(killed))), 0);
    EXPECT_EQ(summary(killed).at("losses"), summary(whole).at("losses"));
    const std::string weights = "/transformer/diffusion_pytorch_model.safetensors";
    EXPECT_EQ(sf::test::read_file(killed + weights), sf::test::read_file(whole + weights));
    // The resumed run took steps 9..12 of the same alternation.
    const auto resumed = summary(killed).at("batch_frames_of_this_run").get<std::vector<int64_t>>();
    ASSERT_EQ(resumed.size(), 12u - summary(killed).at("first_step_of_this_run").get<size_t>());
    EXPECT_TRUE(std::equal(resumed.begin(), resumed.end(), frames.end() - resumed.size()));

    // Joint training needs both kinds in the cache.
    auto o = video_train_options(out.file("videos_only"));
    o.joint_training_interval = 2;
    try {
        sf::pipelines::run_train(o);
        FAIL() << "joint training on a cache without images";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("no images"), std::string::npos) << e.what();
    }
}

// --auto_fit --memory_budget on a video cache: the plan (the video transformer's, on the largest
// window) turns remedies on before the first step, and no step then runs out of the budget.
TEST(TrainVideoIntegration, AutoFitPlansAVideoRunUnderItsBudget) {
    REQUIRE_FFMPEG();
    TempDir out("sf_video_auto_fit");
    auto o = video_train_options(out.file("whole"));
    o.max_train_steps = 2;
    sf::pipelines::run_train(o);
    auto split = o;
    split.output_dir = out.file("split");
    split.micro_batch_split = 2;
    sf::pipelines::run_train(split);
    // Between the two: the plan must turn on at least the split.
    const int64_t budget =
        (sf::test::step_peak(o.output_dir) + sf::test::step_peak(split.output_dir)) / 2;

    auto fitted = o;
    fitted.output_dir = out.file("fitted");
    fitted.auto_fit = true;
    fitted.memory_budget = std::to_string(budget);
    fitted.plan_calibration = out.file("plan-calibration.json");
    fitted.plan_calibration_points = 48;
    const auto report = sf::pipelines::run_train(fitted);
    ASSERT_FALSE(report.planned_changes.empty());
    EXPECT_TRUE(report.out_of_memory_changes.empty()) << report.out_of_memory_changes.front();
    EXPECT_EQ(report.steps, 2);
    EXPECT_LE(sf::test::step_peak(fitted.output_dir), budget);
}

// Validation on a video cache: each prompt's videos sampled from the transformer as it trains,
// decoded by the Wan VAE prep encoded with, written as MP4 clips of the window's frames that
// libav reads back, and a grid of their first, middle and last frames; training draws what it
// would draw without validating; --enable_vae_tiling decodes them through the tiled decoder.
TEST(TrainVideoIntegration, ValidationWritesEachPromptsVideosWithoutChangingTheTraining) {
    REQUIRE_FFMPEG();
    TempDir tmp("sf_video_validation");
    write_clips(tmp.path() / "data");
    auto prep = sf::test::video_options(tmp);
    const std::vector<std::string> prompts = {"a test pattern", "a slow sunset"};
    prep.validation_prompts = prompts;
    sf::pipelines::run_prep(prep);

    TrainOptions o = video_train_options(tmp.file("with"));
    o.cache_dir = tmp.file("cache");
    o.max_train_steps = 2;
    o.validation_prompts = prompts;
    o.num_validation_images = 2;
    o.validation_steps = 1;
    o.validation_inference_steps = 2;
    const auto with = sf::pipelines::run_train(o);
    TrainOptions plain = o;
    plain.validation_prompts.clear();
    plain.output_dir = tmp.file("without");
    EXPECT_EQ(with.losses, sf::pipelines::run_train(plain).losses)
        << "validation changed what training drew";
    ASSERT_EQ(with.validation_dirs, (std::vector<std::string>{tmp.file("with/validation/step-1"),
                                                              tmp.file("with/validation/step-2")}));

    // The cache's windows: 5 frames (2 latent frames), at the bucket's size.
    const sf::stages::DecodeVideoStage reader(sf::stages::DecodeVideoConfig{});
    const sf::stages::ClipInfo like =
        reader.probe(with.validation_dirs[0] + "/prompt-0-video-0.mp4");
    const int w = like.width, h = like.height;
    EXPECT_EQ(w % 8, 0);
    EXPECT_EQ(h % 8, 0);
    EXPECT_GE(std::min(w, h), 32) << "prep's --min_side";
    std::vector<cv::Mat> grids;
    for (const std::string& dir : with.validation_dirs) {
        size_t files = 0;
        for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
        EXPECT_EQ(files, 5u) << dir << ": 2 prompts x 2 videos and the grid";
        for (int p = 0; p < 2; ++p) {
            for (int i = 0; i < 2; ++i) {
                const std::string path = fmt::format("{}/prompt-{}-video-{}.mp4", dir, p, i);
                ASSERT_TRUE(fs::exists(path)) << path;
                const sf::stages::ClipInfo info = reader.probe(path);
                EXPECT_EQ(info.width, w) << path;
                EXPECT_EQ(info.height, h) << path;
                EXPECT_EQ(info.frame_count, 5) << path;
            }
        }
        grids.push_back(cv::imread(dir + "/grid.png"));
        const cv::Mat& grid = grids.back();
        ASSERT_FALSE(grid.empty());
        ASSERT_EQ(grid.rows, 2 * h) << "a row per prompt";
        ASSERT_EQ(grid.cols, 2 * 3 * w) << "three frames of each video";
        const cv::Rect first(0, 0, 3 * w, h);
        EXPECT_GT(cv::norm(grid(first), grid(first + cv::Point(0, h)), cv::NORM_L1), 0)
            << "the prompt does nothing";
        EXPECT_GT(cv::norm(grid(first), grid(first + cv::Point(3 * w, 0)), cv::NORM_L1), 0)
            << "one noise for two videos";
    }
    EXPECT_GT(cv::norm(grids[0], grids[1], cv::NORM_L1), 0) << "step 2 sampled step 1's weights";

    // --enable_vae_tiling: the Wan VAE's tiled decode (upstream's 256-px tiles; the windows are
    // wider): the same training, videos of the same shape, decoded otherwise (the tiny VAE's
    // tiles lack their neighbours' context; the decode itself is held to diffusers' elsewhere).
    ASSERT_GT(std::max(w, h), 256) << "the frames fit one tile: the tiling would not run";
    TrainOptions tiled = o;
    tiled.validation_vae_tiling = true;
    tiled.output_dir = tmp.file("tiled");
    const auto with_tiling = sf::pipelines::run_train(tiled);
    EXPECT_EQ(with_tiling.losses, with.losses);
    ASSERT_EQ(with_tiling.validation_dirs.size(), 2u);
    const std::string first_video = with_tiling.validation_dirs[1] + "/prompt-0-video-0.mp4";
    const sf::stages::ClipInfo tiled_info = reader.probe(first_video);
    EXPECT_EQ(tiled_info.width, w);
    EXPECT_EQ(tiled_info.height, h);
    EXPECT_EQ(tiled_info.frame_count, 5);
    const cv::Mat tiled_grid = cv::imread(with_tiling.validation_dirs[1] + "/grid.png");
    ASSERT_EQ(tiled_grid.size(), grids[1].size());
    EXPECT_GT(cv::norm(tiled_grid, grids[1], cv::NORM_L1), 0) << "the tiling did not run";
}

TEST(TrainVideoIntegration, AnImageTransformerConfigOnAVideoCacheIsRefused) {
    REQUIRE_FFMPEG();
    TempDir out("sf_video_wrong_model");
    const auto config = sf::model::SanaTransformerConfig::named("sana-tiny");
    sf::test::write_file(out.path() / "config.json", config.to_json());
    auto o = video_train_options(out.file("run"));
    o.transformer_config = out.file("config.json");
    try {
        sf::pipelines::run_train(o);
        FAIL() << "an image transformer trained on video windows";
    } catch (const sf::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("SanaTransformer2DModel"), std::string::npos) << what;
        EXPECT_NE(what.find("video windows"), std::string::npos) << what;
    }
}

}  // namespace
