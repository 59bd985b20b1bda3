// `sanaflow plan` through the program: the per-phase table of a real-size configuration, the
// search under --memory_budget with the command line of the best, exit 1 when nothing fits.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "integration_util.h"
#include "test_util.h"

namespace {

using sf::test::kSanaflow;
using sf::test::TempDir;

// The line "best: sanaflow train ..." of a plan's output ("" when there is none).
std::string best_line_of(const std::string& output) {
    const size_t best = output.find("best: sanaflow train --model sana-1600m");
    if (best == std::string::npos) return "";
    return output.substr(best, output.find('\n', best) - best);
}

// The target: a full fine-tune of sana-1600m at 1024 px with checkpointing and bf16 takes
// more than 24 GiB with fp32 AdamW (its moments alone are 12 GiB); the plan finds the remedies
// that fit (the 8-bit moments and the fused backward pass), and refuses 12 GiB unless it may keep
// blocks and moments in host memory.
TEST(Cli, PlanFitsAFullFineTuneOfSana1600mAt1024PixelsInto24GiB) {
    TempDir tmp("sf_plan_cli");
    auto plan_searching = [&](const std::string& search) {
        return kSanaflow +
               " plan --model sana-1600m --resolution 1024 --full_finetune "
               "--train_batch_size 1 --mixed_precision bf16 --gradient_checkpointing "
               "--calibration_points 16 --calibration " +
               tmp.file("calibration.json") + " --search " + search;
    };
    const std::string plan = plan_searching("optimizer,fused_backward");
    const auto fits = sf::test::run_command(plan + " --memory_budget 24GiB");
    ASSERT_EQ(fits.exit_code, 0) << fits.output;
    EXPECT_NE(fits.output.find("1604462752 parameters"), std::string::npos) << fits.output;
    EXPECT_NE(fits.output.find("optimizer state                       11.95 GiB"),
              std::string::npos)
        << fits.output;
    EXPECT_NE(fits.output.find("<- peak"), std::string::npos) << fits.output;
    // Both remedies fit alone; which comes first is the measured step times' call (noisy).
    const std::string best = best_line_of(fits.output);
    EXPECT_TRUE(best.find("--optimizer adamw8bit") != std::string::npos ||
                best.find("--fused_backward_pass") != std::string::npos)
        << fits.output;
    // The given settings alone do not fit: the best one adds a remedy to them.
    EXPECT_EQ(fits.output.find("4 of 4 combinations fit"), std::string::npos) << fits.output;

    const auto none = sf::test::run_command(plan + " --memory_budget 12GiB");
    EXPECT_EQ(none.exit_code, 1) << none.output;
    EXPECT_NE(none.output.find("nothing fits"), std::string::npos) << none.output;
    EXPECT_EQ(none.output.find("plan: calibrated "), std::string::npos)
        << "the second plan measured again instead of reading the calibration file";

    // With the blocks' weights and the moments in host memory, 12 GiB is enough.
    const auto host = sf::test::run_command(
        plan_searching("optimizer,fused_backward,blocks_to_swap,offload_optimizer") +
        " --memory_budget 12GiB");
    ASSERT_EQ(host.exit_code, 0) << host.output;
    // Which of the two comes first is the measured step times' call (noisy): one of them.
    const std::string best_line = best_line_of(host.output);
    EXPECT_TRUE(best_line.find("--blocks_to_swap") != std::string::npos ||
                best_line.find("--offload_optimizer") != std::string::npos)
        << host.output;
    EXPECT_EQ(host.output.find("calibrated full/bf16/ckpt1/swap"), std::string::npos)
        << "block swap beside checkpointing every block is calibrated as checkpointing";

    const auto bad = sf::test::run_command(plan + " --memory_budget 24parsecs");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("--memory_budget"), std::string::npos) << bad.output;
    const auto unknown = sf::test::run_command(plan + " --memory_budget 24GiB --search bogus");
    EXPECT_NE(unknown.exit_code, 0);
    EXPECT_NE(unknown.output.find("bogus"), std::string::npos) << unknown.output;
}

// The video transformer through the program: SANA-Video 2B at 480p over 81-frame windows (21
// latent frames of 30 x 52 patches), and the frame counts the Wan VAE cannot encode refused.
TEST(Cli, PlanPredictsTheVideoTransformerAndRefusesFramesTheVaeCannotEncode) {
    TempDir tmp("sf_plan_video");
    const std::string plan =
        kSanaflow +
        " plan --model sana-video-2b-480p --bucket 832x480 --rank 16 --mixed_precision bf16 "
        "--gradient_checkpointing --calibration_points 16 --search attention --calibration " +
        tmp.file("calibration.json");
    const auto video = sf::test::run_command(plan + " --frames 81 --memory_budget 80GiB");
    ASSERT_EQ(video.exit_code, 0) << video.output;
    EXPECT_NE(video.output.find("video transformer, 20 blocks of width 2240"), std::string::npos)
        << video.output;
    EXPECT_NE(video.output.find("latents 21x60x104 (32760 tokens)"), std::string::npos)
        << video.output;
    EXPECT_NE(video.output.find("calibrated video/lora/bf16/ckpt1/"), std::string::npos)
        << video.output;
    EXPECT_NE(video.output.find("<- peak"), std::string::npos) << video.output;
    EXPECT_NE(video.output.find("best: sanaflow train --model sana-video-2b-480p"),
              std::string::npos)
        << video.output;

    const auto bad = sf::test::run_command(plan + " --frames 80");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("--frames 80"), std::string::npos) << bad.output;
}

// Prior preservation doubles each micro-batch with class samples: the plan predicts what the
// plain run of twice the batch takes, row for row, and splits only whole pairs, so its command
// line's --train_batch_size counts instance samples as train's does.
TEST(Cli, PlanWithPriorPreservationCountsEachBatchTwiceAndSplitsWholePairs) {
    TempDir tmp("sf_plan_prior");
    const std::string plan = kSanaflow +
                             " plan --model sana-600m --resolution 512 --calibration_points 8 "
                             "--search accumulation --memory_budget 1TiB --calibration " +
                             tmp.file("calibration.json");
    const auto prior =
        sf::test::run_command(plan + " --train_batch_size 4 --with_prior_preservation");
    const auto plain = sf::test::run_command(plan + " --train_batch_size 8");
    ASSERT_EQ(prior.exit_code, 0) << prior.output;
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    // The table's rows: "--train_batch_size N ..." -> the peak column.
    const auto rows = [](const std::string& output) {
        std::map<int64_t, std::string> peaks;  // micro-batch -> peak
        std::istringstream lines(output);
        for (std::string line; std::getline(lines, line);) {
            const size_t flag = line.find("--train_batch_size ");
            if (flag == std::string::npos || line.find("best:") != std::string::npos) continue;
            std::istringstream row(line);
            std::string number, unit;
            row >> number >> unit;
            peaks[std::stoll(line.substr(flag + 19))] = number + unit;
        }
        return peaks;
    };
    const auto pairs = rows(prior.output), samples = rows(plain.output);
    EXPECT_EQ(pairs.size(), 3u) << "micro-batches of 4, 2 and 1 pairs: " << prior.output;
    EXPECT_EQ(samples.size(), 4u) << plain.output;
    for (const auto& [micro, peak] : pairs) {
        ASSERT_TRUE(samples.count(2 * micro)) << micro;
        EXPECT_EQ(peak, samples.at(2 * micro)) << micro << " pairs are " << 2 * micro << " samples";
    }
    const auto predicted = [](const std::string& output) {
        const size_t at = output.find("predicted peak");
        return output.substr(at, output.find('\n', at) - at);
    };
    EXPECT_EQ(predicted(prior.output), predicted(plain.output));
    EXPECT_NE(prior.output.find("--with_prior_preservation\n"), std::string::npos) << prior.output;
    EXPECT_NE(prior.output.find("(instance and class samples in pairs)"), std::string::npos);

    const auto video = sf::test::run_command(kSanaflow +
                                             " plan --model sana-video-2b-480p "
                                             "--with_prior_preservation --calibration " +
                                             tmp.file("calibration.json"));
    EXPECT_NE(video.exit_code, 0);
    EXPECT_NE(video.output.find("--with_prior_preservation"), std::string::npos) << video.output;
}

}  // namespace
