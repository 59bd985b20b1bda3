// Prior preservation (stages/train/prior_pairs.h, pipelines/train/class_images.h): `sanaflow
// train --with_prior_preservation` generates the missing class images at the instance buckets'
// sizes, the same ones however many runs it takes, preps them beside the instance images, and
// trains on both with the class loss weighted by --prior_loss_weight.
#include <gtest/gtest.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "integration_util.h"
#include "pipelines/train/class_images.h"
#include "pipelines/train/train.h"
#include "stages/train/train_data.h"
#include "storage/cache.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::TrainOptions;
using sf::test::kSanaflow;
using sf::test::TempDir;

// The class images in `dir`: file name -> bytes.
std::map<std::string, std::string> class_images(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
        out[e.path().filename().string()] = sf::test::read_file(e.path().string());
    return out;
}

std::string prior_command(const TempDir& tmp, const std::string& classes, const std::string& out,
                          int num_class_images) {
    return kSanaflow + " train --instance_data_dir " + tmp.file("data") +
           " --instance_prompt \"photo of sks pet\" --with_prior_preservation --class_data_dir " +
           tmp.file(classes) + " --class_prompt \"photo of a pet\" --num_class_images " +
           std::to_string(num_class_images) +
           " --sample_batch_size 4 --validation_inference_steps 3 --max_train_steps 2 "
           "--train_batch_size 2 --lr_warmup_steps 0 --checkpointing_steps 0 --output_dir " +
           tmp.file(out);
}

// The whole job once, shared by the tests of this file: 6 instance images of 4 shapes, 6 class
// images made into TMP/classes, the caches in TMP/out. Its TempDir, and what the command printed.
const TempDir& prior_run(sf::test::CommandResult* printed = nullptr) {
    static TempDir tmp("sf_prior");
    static const sf::test::CommandResult first = [&] {
        sf::test::write_dataset(tmp.path() / "data", 0, 6);
        return sf::test::run_command(prior_command(tmp, "classes", "out", 6));
    }();
    if (printed != nullptr) *printed = first;
    return tmp;
}

TEST(TrainPrior, ClassImagesAreMadeAtTheInstanceBucketsOnceAndTheSameAcrossRuns) {
    sf::test::CommandResult first;
    const TempDir& tmp = prior_run(&first);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_NE(first.output.find("generating 6 of \"photo of a pet\""), std::string::npos)
        << first.output;
    EXPECT_NE(first.output.find("6 class samples of 6 paired with 6 instance samples"),
              std::string::npos)
        << first.output;
    EXPECT_NE(first.output.find("trained 2 steps"), std::string::npos) << first.output;

    // Upstream's names, <index>-<hash>.jpg; each at the size of an instance bucket, every
    // instance bucket covered (the buckets taken round-robin).
    const auto made = class_images(tmp.file("classes"));
    ASSERT_EQ(made.size(), 6u);
    const std::regex name("[0-5]-[0-9a-f]{32}\\.jpg");
    std::set<std::pair<int, int>> instance_shapes, class_shapes;
    const auto instances =
        sf::train::TrainingSet::open(sf::storage::Cache::open(tmp.file("out/cache"), false));
    for (const auto& [bucket, indices] : instances.buckets())
        instance_shapes.emplace(static_cast<int>(bucket.height), static_cast<int>(bucket.width));
    for (const auto& [file, bytes] : made) {
        EXPECT_TRUE(std::regex_match(file, name)) << file;
        const cv::Mat image = cv::imread(tmp.file("classes/" + file));
        ASSERT_FALSE(image.empty()) << file;
        class_shapes.emplace(image.rows, image.cols);
    }
    EXPECT_EQ(class_shapes, instance_shapes);
    const auto classes =
        sf::train::TrainingSet::open(sf::storage::Cache::open(tmp.file("out/class_cache"), false));
    EXPECT_EQ(classes.samples().size(), 6u) << "prepped into OUTPUT_DIR/class_cache";

    // Asking for 8 makes the 2 missing (indices 6 and 7) and leaves the 6 as they were; made in
    // one go elsewhere, the 8 are the same files: a run killed midway resumes to the same set.
    const auto more = sf::test::run_command(prior_command(tmp, "classes", "out_more", 8));
    ASSERT_EQ(more.exit_code, 0) << more.output;
    EXPECT_NE(more.output.find("6 class images in"), std::string::npos) << more.output;
    EXPECT_NE(more.output.find("generating 2 of"), std::string::npos) << more.output;
    const auto eight = class_images(tmp.file("classes"));
    ASSERT_EQ(eight.size(), 8u);
    for (const auto& [file, bytes] : made) EXPECT_EQ(eight.at(file), bytes) << file;
    // Batched otherwise, the sampling rounds otherwise: the same images to a tenth of a level
    // (measured: 0.001 on the two made in other batches), under names whose hashes may differ.
    const auto fresh = sf::test::run_command(prior_command(tmp, "classes_fresh", "out_fresh", 8));
    ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
    const auto fresh_images = class_images(tmp.file("classes_fresh"));
    ASSERT_EQ(fresh_images.size(), 8u);
    auto by_index = [](const std::map<std::string, std::string>& files) {
        std::map<std::string, std::string> out;  // "3" -> the name
        for (const auto& [file, bytes] : files) out[file.substr(0, file.find('-'))] = file;
        return out;
    };
    const auto a = by_index(eight), b = by_index(fresh_images);
    ASSERT_EQ(a.size(), 8u);
    for (const auto& [index, file] : a) {
        ASSERT_EQ(b.count(index), 1u) << index;
        const cv::Mat x = cv::imread(tmp.file("classes/" + file));
        const cv::Mat y = cv::imread(tmp.file("classes_fresh/" + b.at(index)));
        ASSERT_EQ(x.size(), y.size()) << index;
        cv::Mat diff;
        cv::absdiff(x, y, diff);
        const cv::Scalar mean = cv::mean(diff);
        EXPECT_LT(mean[0] + mean[1] + mean[2], 0.3) << index;
    }
    // Enough there: nothing generated, no model loaded for it.
    const auto again = sf::test::run_command(prior_command(tmp, "classes", "out_again", 8));
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_EQ(again.output.find("generating"), std::string::npos) << again.output;
}

// The loss of a step is the instance loss plus --prior_loss_weight x the class loss: the same
// batch, noise and forward pass under weights 0, 1 and 2 (learning rate 0). A checkpoint resumes
// only with the same weight.
TEST(TrainPrior, TheLossAddsTheClassLossTimesItsWeight) {
    const TempDir& tmp = prior_run();
    ASSERT_TRUE(fs::exists(tmp.file("out/class_cache"))) << "the shared run failed";
    auto options = [&](double weight, const std::string& out) {
        TrainOptions o;
        o.cache_dir = tmp.file("out/cache");
        o.class_cache_dir = tmp.file("out/class_cache");
        o.prior_loss_weight = weight;
        o.output_dir = tmp.file(out);
        o.max_train_steps = 1;
        o.train_batch_size = 2;
        o.learning_rate = 0;
        o.checkpointing_steps = 1;
        o.report_to = "none";
        return o;
    };
    auto loss_at = [&](double weight, const std::string& out) {
        return sf::pipelines::run_train(options(weight, out)).losses.at(0);
    };
    const double l0 = loss_at(0, "w0"), l1 = loss_at(1, "w1"), l2 = loss_at(2, "w2");
    EXPECT_GT(l1, l0 + 1e-3) << "the class samples add nothing";
    EXPECT_NEAR(l2 - l0, 2 * (l1 - l0), 1e-5 * l2);
    TrainOptions resume = options(2, "w1");
    resume.max_train_steps = 2;
    resume.resume_from_checkpoint = "latest";
    sf::test::expect_error([&] { sf::pipelines::run_train(resume); },
                           sf::ErrorCode::kInvalidArgument, "prior_loss_weight");
}

// The class flags are checked before any work, as upstream's argparse checks them; the class and
// instance folders may not overlap.
TEST(TrainPrior, MissingClassFlagsAreNamedBeforeAnyWork) {
    TempDir tmp("sf_prior_flags");
    sf::test::write_dataset(tmp.path() / "data", 0, 2);
    const auto no_prompt =
        sf::test::run_command(kSanaflow + " train --instance_data_dir " + tmp.file("data") +
                              " --with_prior_preservation --class_data_dir " + tmp.file("c") +
                              " --output_dir " + tmp.file("out"));
    EXPECT_EQ(no_prompt.exit_code, 2) << no_prompt.output;
    EXPECT_NE(no_prompt.output.find("needs --class_prompt"), std::string::npos) << no_prompt.output;
    EXPECT_FALSE(fs::exists(tmp.file("out/cache"))) << "refused after work began";
    const auto no_dir =
        sf::test::run_command(kSanaflow + " train --instance_data_dir " + tmp.file("data") +
                              " --with_prior_preservation --class_prompt dog");
    EXPECT_EQ(no_dir.exit_code, 2) << no_dir.output;
    EXPECT_NE(no_dir.output.find("needs --class_data_dir"), std::string::npos) << no_dir.output;
    const auto cache_only = sf::test::run_command(
        kSanaflow + " train --cache_dir " + tmp.file("cache") +
        " --with_prior_preservation --class_data_dir " + tmp.file("c") + " --class_prompt dog");
    EXPECT_EQ(cache_only.exit_code, 2) << cache_only.output;
    EXPECT_NE(cache_only.output.find("give --instance_data_dir"), std::string::npos)
        << cache_only.output;
    // Fewer class images to make than the instances' 2 aspect buckets (300x300 and 320x240
    // images): refused after the instance prep, before any image is made.
    const auto few = sf::test::run_command(
        kSanaflow + " train --instance_data_dir " + tmp.file("data") +
        " --with_prior_preservation --class_prompt dog --num_class_images 1 --class_data_dir " +
        tmp.file("few") + " --output_dir " + tmp.file("few_out"));
    EXPECT_EQ(few.exit_code, 2) << few.output;
    EXPECT_NE(few.output.find("--num_class_images 1 cannot cover the 2 aspect buckets"),
              std::string::npos)
        << few.output;
    EXPECT_EQ(sf::pipelines::count_class_images(tmp.file("few")), 0);
    // The class images may not go among the instance images, nor the other way round.
    for (const std::string& classes :
         {tmp.file("data"), tmp.file("data/sub"), tmp.path().string()}) {
        const auto overlap = sf::test::run_command(
            kSanaflow + " train --instance_data_dir " + tmp.file("data") +
            " --with_prior_preservation --class_prompt dog --class_data_dir " + classes +
            " --output_dir " + tmp.file("overlap"));
        EXPECT_EQ(overlap.exit_code, 2) << classes << ": " << overlap.output;
        EXPECT_NE(overlap.output.find("overlap"), std::string::npos) << overlap.output;
    }
    EXPECT_FALSE(fs::exists(tmp.file("overlap/cache")));
    // fp16 generation where autocast refuses it (the CPU of LibTorch 1.13) is named before prep;
    // where it runs (LibTorch 2.x), two images (the default 100 took 118 s there in fp16).
    const auto fp16 = sf::test::run_command(
        kSanaflow + " train --instance_data_dir " + tmp.file("data") +
        " --with_prior_preservation --class_data_dir " + tmp.file("c") +
        " --class_prompt dog --prior_generation_precision fp16 --max_train_steps 1 "
        "--train_batch_size 1 --validation_inference_steps 1 --num_class_images 2 "
        "--output_dir " +
        tmp.file("fp16"));
    if (fp16.exit_code != 0) {
        EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
        EXPECT_NE(fp16.output.find("give --prior_generation_precision bf16 or fp32"),
                  std::string::npos)
            << fp16.output;
        EXPECT_FALSE(fs::exists(tmp.file("fp16/cache"))) << "refused after work began";
    }
}

}  // namespace
