// Validation samples while training (pipelines/train/validation.h): prep caches the prompts, the
// run writes each prompt's images and a grid at the steps asked, measures the phase, and trains
// exactly as it would without validating.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <sstream>

#include "core/error.h"
#include "integration_util.h"
#include "pipelines/inspect.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::TrainOptions;
using sf::test::kSanaflow;
using sf::test::TempDir;

TrainOptions validating_options(const TempDir& tmp, const std::string& out) {
    TrainOptions o;
    o.rank = 0;
    o.lr_warmup_steps = 0;
    o.learning_rate = 2e-3;
    o.cache_dir = tmp.file("cache");
    o.output_dir = tmp.file(out);
    o.max_train_steps = 3;
    o.train_batch_size = 2;
    o.checkpointing_steps = 0;
    o.validation_prompts = {"a red cube", "a blue ball"};
    o.num_validation_images = 2;
    o.validation_steps = 2;
    o.validation_inference_steps = 2;
    return o;
}

double difference(const cv::Mat& a, const cv::Mat& b) { return cv::norm(a, b, cv::NORM_L1); }

TEST(TrainValidation, WritesEachPromptsImagesAndAGridWithoutChangingTheTraining) {
    TempDir tmp("sf_validation");
    sf::test::write_dataset(tmp.path() / "data", 0, 6);
    auto prep = sf::test::options_for(tmp);
    prep.validation_prompts = {"a red cube", "a blue ball"};
    sf::pipelines::run_prep(prep);
    const auto verified = sf::pipelines::inspect_cache(tmp.file("cache"), /*verify=*/true);
    EXPECT_TRUE(verified.ok) << "the prompts' records are keyed as inspect expects: "
                             << verified.text;

    const TrainOptions o = validating_options(tmp, "with");
    const auto with = sf::pipelines::run_train(o);
    TrainOptions plain = o;
    plain.validation_prompts.clear();
    plain.output_dir = tmp.file("without");
    const auto without = sf::pipelines::run_train(plain);
    EXPECT_EQ(with.losses, without.losses) << "validation changed what training drew";
    EXPECT_TRUE(without.validation_dirs.empty());

    // Step 2 (every 2 steps) and step 3 (the last).
    ASSERT_EQ(with.validation_dirs, (std::vector<std::string>{tmp.file("with/validation/step-2"),
                                                              tmp.file("with/validation/step-3")}));
    std::vector<cv::Mat> first;  // step 2's images
    for (const std::string& dir : with.validation_dirs) {
        size_t files = 0;
        for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
        EXPECT_EQ(files, 5u) << dir << ": 2 prompts x 2 images and the grid";
        std::vector<cv::Mat> images;
        for (int p = 0; p < 2; ++p) {
            for (int i = 0; i < 2; ++i) {
                const std::string path = fmt::format("{}/prompt-{}-image-{}.png", dir, p, i);
                images.push_back(cv::imread(path));
                ASSERT_FALSE(images.back().empty()) << path;
            }
        }
        const cv::Mat grid = cv::imread(dir + "/grid.png");
        ASSERT_FALSE(grid.empty());
        const int h = images[0].rows, w = images[0].cols;
        EXPECT_EQ(h % 32, 0);
        EXPECT_EQ(grid.rows, 2 * h) << "a row per prompt";
        EXPECT_EQ(grid.cols, 2 * w) << "an image per column";
        EXPECT_EQ(difference(grid(cv::Rect(w, h, w, h)), images[3]), 0) << "prompt 1, image 1";
        EXPECT_GT(difference(images[0], images[1]), 0) << "one noise for two images";
        EXPECT_GT(difference(images[0], images[2]), 0) << "the prompt does nothing";
        if (first.empty()) {
            first = images;
        } else {
            EXPECT_GT(difference(first[0], images[0]), 0) << "step 3 sampled step 2's weights";
        }
    }
    EXPECT_NE(with.phase_table.find("validation"), std::string::npos) << with.phase_table;
    // Step 3's metrics line holds the validation peak of step 2.
    std::istringstream lines(sf::test::read_file(tmp.file("with/metrics.jsonl")));
    std::string line, last;
    while (std::getline(lines, line)) last = line;
    EXPECT_TRUE(nlohmann::json::parse(last).at("peak_bytes").contains("validation")) << last;

    TrainOptions missing = o;
    missing.validation_prompts = {"never prepped"};
    missing.output_dir = tmp.file("missing");
    sf::test::expect_error([&] { sf::pipelines::run_train(missing); },
                           sf::ErrorCode::kInvalidArgument,
                           "--validation_prompt \"never prepped\" is not in the cache");
    EXPECT_FALSE(fs::exists(tmp.file("missing/metrics.jsonl"))) << "refused after work began";
}

// The one-command form as upstream's users type it: the prompt is prepped with the data, images
// come at the end of each --validation_epochs epoch and at the end; --validation_prompt repeats.
TEST(TrainValidation, TheOneCommandFormPrepsThePromptsAndSamplesByEpochs) {
    TempDir tmp("sf_validation_cli");
    sf::test::write_dataset(tmp.path() / "data", 0, 4);
    const std::string out = tmp.file("out");
    const auto r = sf::test::run_command(
        kSanaflow + " train --instance_data_dir " + tmp.file("data") +
        " --validation_prompt \"a red cube\" --validation_prompt 'a blue ball' "
        "--num_validation_images 1 --validation_epochs 2 --validation_inference_steps 2 "
        "--num_train_epochs 3 --train_batch_size 4 --lr_warmup_steps 0 --output_dir " +
        out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // One batch per epoch of each bucket: the epochs end at every k-th step, k the batches.
    std::vector<std::string> dirs;
    for (const auto& e : fs::directory_iterator(out + "/validation"))
        dirs.push_back(e.path().filename().string());
    std::sort(dirs.begin(), dirs.end());
    ASSERT_FALSE(dirs.empty()) << r.output;
    for (const std::string& d : dirs) {
        EXPECT_TRUE(fs::exists(fmt::format("{}/validation/{}/prompt-1-image-0.png", out, d))) << d;
    }
    const auto summary = nlohmann::json::parse(sf::test::read_file(out + "/training_summary.json"));
    const int64_t steps = summary.at("steps").get<int64_t>();
    ASSERT_EQ(steps % 3, 0) << "three epochs of equal length";
    const int64_t per_epoch = steps / 3;
    // Epochs 0 and 2 end at steps per_epoch and 3 per_epoch (the last): 0 % 2 == 2 % 2 == 0.
    std::vector<std::string> expected = {fmt::format("step-{}", per_epoch),
                                         fmt::format("step-{}", 3 * per_epoch)};
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(dirs, expected) << r.output;
}

// The sampler is upstream's pipeline's: a model root's scheduler/scheduler_config.json when it has
// one, else DPM-Solver++ as Sana's pipelines; --validation_scheduler picks one instead, and a
// config it cannot run is refused naming the file before any step.
TEST(TrainValidation, TheModelRootsSchedulerConfigChoosesTheSampler) {
    TempDir tmp("sf_validation_scheduler");
    sf::test::write_dataset(tmp.path() / "data", 0, 4);
    auto prep = sf::test::options_for(tmp);
    prep.validation_prompts = {"a red cube"};
    sf::pipelines::run_prep(prep);
    TrainOptions base = validating_options(tmp, "base");
    base.validation_prompts.clear();
    base.max_train_steps = 1;
    sf::pipelines::run_train(base);  // a full fine-tune's OUTPUT_DIR is a model root
    const fs::path root = tmp.file("base");
    fs::create_directories(root / "scheduler");
    const auto image_of = [&](const std::string& scheduler, const std::string& out) {
        TrainOptions o = validating_options(tmp, out);
        o.pretrained_model_name_or_path = root.string();
        o.validation_prompts = {"a red cube"};
        o.num_validation_images = 1;
        o.max_train_steps = 1;
        o.learning_rate = 0;
        o.validation_inference_steps = 4;
        o.validation_scheduler = scheduler;
        const auto report = sf::pipelines::run_train(o);
        return cv::imread(report.validation_dirs.at(0) + "/prompt-0-image-0.png");
    };
    sf::test::write_file(root / "scheduler" / "scheduler_config.json",
                         R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0})");
    const cv::Mat from_config = image_of("auto", "auto_euler");
    ASSERT_FALSE(from_config.empty());
    EXPECT_EQ(difference(from_config, image_of("euler", "euler")), 0) << "the config's Euler";
    const cv::Mat dpm = image_of("dpm_solver", "dpm");
    EXPECT_GT(difference(from_config, dpm), 0) << "the flag did not pick DPM-Solver++";
    // Sana's own config (lambda_min_clipped as Python writes it) is DPM-Solver++ 2M at shift 3.
    sf::test::write_file(root / "scheduler" / "scheduler_config.json",
                         R"({"_class_name": "DPMSolverMultistepScheduler", "flow_shift": 3.0,
                             "prediction_type": "flow_prediction", "use_flow_sigmas": true,
                             "lambda_min_clipped": -Infinity})");
    EXPECT_EQ(difference(image_of("auto", "auto_dpm"), dpm), 0) << "the config's DPM-Solver++";
    fs::remove(root / "scheduler" / "scheduler_config.json");
    EXPECT_EQ(difference(image_of("auto", "no_config"), dpm), 0) << "not Sana's pipelines' default";

    sf::test::write_file(root / "scheduler" / "scheduler_config.json",
                         R"({"_class_name": "EulerAncestralDiscreteScheduler"})");
    sf::test::expect_error(
        [&] { image_of("auto", "refused"); }, sf::ErrorCode::kInvalidArgument,
        "scheduler_config.json: \"_class_name\" is \"EulerAncestralDiscreteScheduler\"");
    EXPECT_FALSE(fs::exists(tmp.file("refused/metrics.jsonl"))) << "refused after work began";
    EXPECT_FALSE(image_of("euler", "ignored").empty()) << "an explicit sampler reads no config";
}

}  // namespace
