// Progress: the formatting (pure functions), the mode choice and the printing cadence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "graph/progress.h"

namespace sf::graph {
namespace {

TEST(ProgressFormat, Durations) {
    EXPECT_EQ(format_duration(0), "0s");
    EXPECT_EQ(format_duration(25.4), "25s");
    EXPECT_EQ(format_duration(59.6), "1m00s");
    EXPECT_EQ(format_duration(245), "4m05s");
    EXPECT_EQ(format_duration(7380), "2h03m");
    EXPECT_EQ(format_duration(-1), "?");
}

TEST(ProgressFormat, EtaIsRemainingItemsAtTheAverageRate) {
    EXPECT_DOUBLE_EQ(progress_eta_seconds(120, 1000, 12.0), 88.0);  // 10 items/s, 880 left
    EXPECT_DOUBLE_EQ(progress_eta_seconds(1000, 1000, 12.0), 0.0);
    EXPECT_LT(progress_eta_seconds(0, 1000, 12.0), 0);  // no rate yet
    EXPECT_LT(progress_eta_seconds(5, -1, 12.0), 0);    // no total
}

TEST(ProgressFormat, PlainLine) {
    EXPECT_EQ(format_progress_line("prep/decode", 120, 1000, 12.0),
              "prep/decode: 120/1000 (12.0%) 10.0 items/s ETA 1m28s");
    EXPECT_EQ(format_progress_line("prep/decode", 0, 1000, 0.0),
              "prep/decode: 0/1000 (0.0%) 0.0 items/s ETA ?");
    EXPECT_EQ(format_progress_line("scan", 5, -1, 2.0), "scan: 5 items 2.5 items/s");
}

TEST(ProgressFormat, FinalLine) {
    EXPECT_EQ(format_progress_final("prep", 1000, 1000, 28.4),
              "prep: 1000/1000 (100.0%) 35.2 items/s, done in 28s");
    EXPECT_EQ(format_progress_final("scan", 7, -1, 2.0), "scan: 7 items 3.5 items/s, done in 2s");
}

TEST(ProgressFormat, BarFitsTheTerminal) {
    const std::string bar = format_progress_bar("prep", 50, 100, 10.0, 80);
    EXPECT_EQ(bar.rfind("prep [", 0), 0u) << bar;
    EXPECT_NE(bar.find("] 50/100 50.0% 5.0 items/s ETA 10s"), std::string::npos) << bar;
    EXPECT_LE(bar.size(), 79u);
    const size_t open = bar.find('['), close = bar.find(']');
    const std::string cells = bar.substr(open + 1, close - open - 1);
    EXPECT_EQ(std::count(cells.begin(), cells.end(), '#'), static_cast<long>(cells.size() / 2));

    // Too narrow for a bar: the counts remain, cut to fit.
    const std::string narrow = format_progress_bar("prep", 50, 100, 10.0, 30);
    EXPECT_EQ(narrow.find('['), std::string::npos) << narrow;
    EXPECT_LE(narrow.size(), 29u);
    EXPECT_EQ(format_progress_bar("scan", 5, -1, 1.0, 80), "scan 5 items 5.0 items/s");
}

TEST(ProgressMode, EnvironmentOverridesThenRequestThenTerminal) {
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kAuto, nullptr, true), ProgressMode::kBar);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kAuto, nullptr, false), ProgressMode::kPlain);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kOff, nullptr, true), ProgressMode::kOff);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kBar, "plain", true), ProgressMode::kPlain);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kAuto, "off", true), ProgressMode::kOff);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kPlain, "bar", false), ProgressMode::kBar);
    EXPECT_EQ(resolve_progress_mode(ProgressMode::kAuto, "sparkles", false), ProgressMode::kPlain);
}

// Reads back what a Progress wrote to a temporary file.
std::string read_all(std::FILE* file) {
    std::fflush(file);
    std::rewind(file);
    std::string text;
    char buffer[256];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
    return text;
}

// Keeps the developer's SANAFLOW_PROGRESS from changing what the test sees.
class ProgressOutput : public ::testing::Test {
protected:
    void SetUp() override {
        if (const char* env = std::getenv("SANAFLOW_PROGRESS")) saved_ = env, had_ = true;
        unsetenv("SANAFLOW_PROGRESS");
        file_ = std::tmpfile();
        ASSERT_NE(file_, nullptr);
    }
    void TearDown() override {
        if (had_) setenv("SANAFLOW_PROGRESS", saved_.c_str(), 1);
        std::fclose(file_);
    }
    std::FILE* file_ = nullptr;
    std::string saved_;
    bool had_ = false;
};

TEST_F(ProgressOutput, PlainLinesAtTheIntervalAndOneFinalLine) {
    ProgressOptions options{ProgressMode::kPlain, /*plain_interval_seconds=*/3600.0, 0.1, file_};
    {
        Progress progress("prep", 10, options);
        for (int i = 0; i < 10; ++i) progress.advance();
        EXPECT_EQ(progress.done(), 10);
        EXPECT_EQ(read_all(file_), "");  // the interval has not passed
        progress.finish();
        progress.finish();  // idempotent; the destructor calls it again
    }
    const std::string text = read_all(file_);
    EXPECT_EQ(text.rfind("prep: 10/10 (100.0%) ", 0), 0u) << text;
    EXPECT_NE(text.find("done in"), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

TEST_F(ProgressOutput, ZeroIntervalPrintsEveryAdvance) {
    ProgressOptions options{ProgressMode::kPlain, 0.0, 0.0, file_};
    Progress progress("scan", -1, options);
    progress.advance(2);
    progress.advance(3);
    progress.finish();
    const std::string text = read_all(file_);
    EXPECT_NE(text.find("scan: 2 items"), std::string::npos) << text;
    EXPECT_NE(text.find("scan: 5 items"), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
}

TEST_F(ProgressOutput, BarRedrawsOneLineInPlace) {
    ProgressOptions options{ProgressMode::kBar, 5.0, 0.0, file_};
    {
        Progress progress("prep", 4, options);
        for (int i = 0; i < 4; ++i) progress.advance();
    }
    const std::string text = read_all(file_);
    EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 5) << text;  // 4 redraws + final
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    EXPECT_NE(text.find("4/4 100.0%"), std::string::npos) << text;
}

TEST_F(ProgressOutput, OffPrintsNothingButStillCounts) {
    ProgressOptions options{ProgressMode::kOff, 0.0, 0.0, file_};
    Progress progress("quiet", 100, options);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 25; ++i) progress.advance();
        });
    }
    for (std::thread& t : threads) t.join();
    progress.finish();
    EXPECT_EQ(progress.done(), 100);
    EXPECT_EQ(read_all(file_), "");
}

}  // namespace
}  // namespace sf::graph
