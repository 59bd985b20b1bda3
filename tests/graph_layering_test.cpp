// Layering: TBB stays inside graph/. Stage code never includes a TBB header, pipeline code never
// includes flow_graph.h, and graph/'s public headers include neither, so that including them does
// not pull TBB in.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/cancel.h"
#include "graph/device_lease.h"
#include "graph/pipeline.h"
#include "graph/progress.h"

// The same promise, checked by the compiler for this translation unit.
#if defined(__TBB_flow_graph_H) || defined(__TBB_tbb_stddef_H) || defined(__TBB_detail__config_H)
#error "a public graph/ header pulled in TBB"
#endif

namespace sf::graph {
namespace {

namespace fs = std::filesystem;

// "path:line: text" for every #include line in C++ sources under `dir` that contains one of
// `needles`; `sources` counts the files looked at.
std::vector<std::string> includes_matching(const fs::path& dir,
                                           const std::vector<std::string>& needles, int& sources) {
    std::vector<std::string> hits;
    if (!fs::is_directory(dir)) return hits;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        const std::string ext = entry.path().extension().string();
        if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".hpp")) continue;
        ++sources;
        std::ifstream in(entry.path());
        std::string line;
        for (int number = 1; std::getline(in, line); ++number) {
            if (line.find("#include") == std::string::npos) continue;
            for (const std::string& needle : needles) {
                if (line.find(needle) != std::string::npos) {
                    hits.push_back(entry.path().string() + ":" + std::to_string(number) + ": " +
                                   line);
                }
            }
        }
    }
    return hits;
}

const fs::path kSource = SANAFLOW_SOURCE_DIR;

TEST(Layering, StageSourcesIncludeNoTbbHeader) {
    int sources = 0;
    auto hits = includes_matching(kSource / "stages", {"tbb/", "tbb.h", "flow_graph"}, sources);
    if (sources == 0) GTEST_SKIP() << "no sources under stages/ yet";
    EXPECT_TRUE(hits.empty()) << hits.front();
}

TEST(Layering, PipelineSourcesIncludeNoFlowGraph) {
    int sources = 0;
    auto hits = includes_matching(kSource / "pipelines", {"flow_graph"}, sources);
    if (sources == 0) GTEST_SKIP() << "no sources under pipelines/ yet";
    EXPECT_TRUE(hits.empty()) << hits.front();
}

TEST(Layering, PublicGraphHeadersIncludeNoTbb) {
    for (const char* header : {"cancel.h", "device_lease.h", "pipeline.h", "progress.h"}) {
        std::ifstream in(kSource / "graph" / header);
        ASSERT_TRUE(in) << header;
        std::string line;
        while (std::getline(in, line)) {
            if (line.find("#include") == std::string::npos) continue;
            EXPECT_EQ(line.find("tbb"), std::string::npos) << header << ": " << line;
        }
    }
}

}  // namespace
}  // namespace sf::graph
