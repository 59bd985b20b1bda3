// --auto_fit (pipelines/train): a run under a memory budget starts with the remedies its plan
// predicts to fit (stages/plan/start_plan.h), is refused with the plan's table when none does,
// and a step that still runs out of memory runs again adapted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/memory.h"
#include "integration_util.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "stages/train/auto_fit.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using sf::pipelines::TrainOptions;
using sf::test::losses_in;
using sf::test::TempDir;

const std::string& auto_fit_cache() {
    static TempDir tmp("sf_auto_fit_cache");
    static const std::string cache = [&] {
        sf::test::write_dataset(tmp.path() / "data", 0, 8);
        sf::pipelines::run_prep(sf::test::options_for(tmp));
        return tmp.file("cache");
    }();
    return cache;
}

// One calibration for the file's tests (measured by the first plan).
const std::string& calibration_file() {
    static TempDir tmp("sf_auto_fit_calibration");
    static const std::string file = tmp.file("plan-calibration.json");
    return file;
}

// Three full fine-tune steps of micro-batch 4.
TrainOptions auto_fit_options(const std::string& out) {
    TrainOptions o;
    o.rank = 0;
    o.lr_warmup_steps = 0;
    o.cache_dir = auto_fit_cache();
    o.output_dir = out;
    o.max_train_steps = 3;
    o.train_batch_size = 4;
    o.learning_rate = 2e-3;
    o.checkpointing_steps = 0;
    o.log_every = 1000;
    o.plan_calibration = calibration_file();
    o.plan_calibration_points = 48;  // half the default: enough for the tiny model, twice as fast
    return o;
}

const std::string kWeights = "/transformer/diffusion_pytorch_model.safetensors";

// The run's settings with the first `n` of train::relieve()'s remedies turned on.
TrainOptions relieved(TrainOptions o, size_t n) {
    sf::train::TrainStepOptions s;
    s.micro_batch_split = o.micro_batch_split;
    s.gradient_checkpointing = o.gradient_checkpointing;
    s.attention = o.attention;
    s.ff_chunk_size = o.ff_chunk_size;
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(sf::train::relieve(s, o.train_batch_size, false));
    o.micro_batch_split = s.micro_batch_split;
    o.gradient_checkpointing = s.gradient_checkpointing;
    o.attention = s.attention;
    o.ff_chunk_size = s.ff_chunk_size;
    return o;
}

// Runs `o` as given and with --micro_batch_split 2 (in out/whole and out/split) and returns
// their step peaks.
std::pair<int64_t, int64_t> whole_and_split_peaks(TrainOptions o, const TempDir& out) {
    o.output_dir = out.file("whole");
    sf::pipelines::run_train(o);
    o.output_dir = out.file("split");
    o.micro_batch_split = 2;
    sf::pipelines::run_train(o);
    return {sf::test::step_peak(out.file("whole")), sf::test::step_peak(out.file("split"))};
}

// Under a byte budget that the first step does not fit at micro-batch 4, the run (its plan off:
// no --memory_budget, the budget set around it) splits the micro-batch and goes on; it ends with
// the very weights of a run started with --micro_batch_split 2, and without --auto_fit the same
// budget stops the run naming the phase.
TEST(TrainAutoFit, RecoversFromOutOfMemoryAsIfStartedAdapted) {
    TempDir out("sf_train_auto_fit");
    const auto o = auto_fit_options(out.file("whole"));
    const auto [whole_peak, split_peak] = whole_and_split_peaks(o, out);
    ASSERT_LT(split_peak, whole_peak);
    const int64_t budget = (whole_peak + split_peak) / 2;

    auto fitted = o;
    fitted.output_dir = out.file("fitted");
    fitted.auto_fit = true;
    sf::pipelines::TrainReport report;
    {
        const sf::mem::BudgetGuard guard(budget);
        report = sf::pipelines::run_train(fitted);
    }
    EXPECT_TRUE(report.planned_changes.empty());
    EXPECT_EQ(report.out_of_memory_changes.size(), 1u);
    EXPECT_EQ(sf::test::read_file(fitted.output_dir + kWeights),
              sf::test::read_file(out.file("split") + kWeights));
    EXPECT_EQ(losses_in(fitted.output_dir), losses_in(out.file("split")));

    auto plain = o;
    plain.output_dir = out.file("plain");
    try {
        const sf::mem::BudgetGuard guard(budget);
        sf::pipelines::run_train(plain);
        ADD_FAILURE() << "the budget did not bite";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kOutOfMemory);
        EXPECT_NE(std::string(e.what()).find("phase of step 1"), std::string::npos) << e.what();
    }
}

// With --memory_budget below what the first step takes, the plan turns remedies on before it:
// no step runs out of memory, and the run ends with the weights and losses of a run started with
// those remedies under the same budget.
TEST(TrainAutoFit, PlansBeforeTheFirstStepAndEndsAsARunStartedThatWay) {
    TempDir out("sf_train_auto_fit_plan");
    const auto o = auto_fit_options(out.file("whole"));
    const auto [whole_peak, split_peak] = whole_and_split_peaks(o, out);
    const int64_t budget = (whole_peak + split_peak) / 2;

    auto fitted = o;
    fitted.output_dir = out.file("fitted");
    fitted.auto_fit = true;
    fitted.memory_budget = std::to_string(budget);
    const auto report = sf::pipelines::run_train(fitted);
    ASSERT_FALSE(report.planned_changes.empty());
    EXPECT_TRUE(report.out_of_memory_changes.empty()) << report.out_of_memory_changes.front();
    EXPECT_LE(sf::test::step_peak(fitted.output_dir), budget);

    auto started = relieved(o, report.planned_changes.size());
    started.output_dir = out.file("started");
    started.memory_budget = fitted.memory_budget;
    sf::pipelines::run_train(started);
    EXPECT_EQ(sf::test::read_file(fitted.output_dir + kWeights),
              sf::test::read_file(started.output_dir + kWeights));
    EXPECT_EQ(losses_in(fitted.output_dir), losses_in(started.output_dir));
}

// When even every remedy of --auto_fit is predicted over the budget, the run is refused before
// its first step with the plan's table, and writes no weights.
TEST(TrainAutoFit, RefusesARunThatNothingFitsWithThePlansTable) {
    TempDir out("sf_train_auto_fit_refused");
    auto floor = relieved(auto_fit_options(out.file("floor")), 5);  // split 4 ... chunked ff
    sf::pipelines::run_train(floor);
    auto o = auto_fit_options(out.file("refused"));
    o.auto_fit = true;
    o.memory_budget = std::to_string(sf::test::step_peak(floor.output_dir) / 2);
    try {
        sf::pipelines::run_train(o);
        ADD_FAILURE() << "a run that cannot fit was not refused";
    } catch (const sf::Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.code(), sf::ErrorCode::kOutOfMemory);
        EXPECT_NE(what.find("--memory_budget"), std::string::npos) << what;
        EXPECT_NE(what.find("<- peak"), std::string::npos) << what;
        EXPECT_NE(what.find("--gradient_checkpointing"), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(o.output_dir + kWeights));
    EXPECT_FALSE(fs::exists(fs::path(o.output_dir) / "metrics.jsonl"));

    o.memory_budget = "24 parsecs";
    try {
        sf::pipelines::run_train(o);
        ADD_FAILURE() << "a bad --memory_budget was accepted";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("--memory_budget"), std::string::npos) << e.what();
    }
}

}  // namespace
