// Layering: every #include of a project header points down the dependency order
//
//     core <- storage, graph;  storage <- model;  model, graph <- stages <- pipelines <- tools
//
// and, inside model/ and stages/, a part includes only the parts it is allowed to (model/common
// is below every model family; the families and the stage parts do not include each other). TBB
// stays inside graph/: stage code never includes a TBB header, pipeline code never includes
// flow_graph.h, and graph/'s public headers include neither.
//
// The checker is a plain function over a directory tree, so the test also runs it on a tree it
// writes itself with one wrong include, and sees it caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/cancel.h"
#include "graph/device_lease.h"
#include "graph/pipeline.h"
#include "graph/progress.h"

// graph/'s public headers, checked by the compiler for this translation unit too.
#if defined(__TBB_flow_graph_H) || defined(__TBB_tbb_stddef_H) || defined(__TBB_detail__config_H)
#error "a public graph/ header pulled in TBB"
#endif

namespace sf {
namespace {

namespace fs = std::filesystem;

// The folder a project path belongs to for layering: "model/sana" for "model/sana/x.h", "core"
// for "core/x.h". Subfolders count in model/ and stages/ only.
std::string part_of(const std::string& path) {
    const size_t slash = path.find('/');
    if (slash == std::string::npos) return "";
    const std::string top = path.substr(0, slash);
    if (top == "model" || top == "stages") {
        const size_t second = path.find('/', slash + 1);
        if (second != std::string::npos) return path.substr(0, second);
    }
    return top;
}

std::string top_of(const std::string& part) { return part.substr(0, part.find('/')); }

// What each top-level folder may include besides itself.
const std::map<std::string, std::set<std::string>> kAllowedTop = {
    {"core", {}},
    {"storage", {"core"}},
    {"graph", {"core"}},
    {"model", {"core", "storage"}},
    {"stages", {"core", "storage", "graph", "model"}},
    {"pipelines", {"core", "storage", "graph", "model", "stages"}},
    {"tools", {"core", "storage", "graph", "model", "stages", "pipelines", "tools"}},
};

// Inside model/ and stages/: which sibling parts a part may include. Every model family may use
// model/common; nothing else crosses between parts unless listed here.
const std::map<std::string, std::set<std::string>> kAllowedSiblings = {
    {"model/sana_video", {"model/sana"}},     {"stages/video", {"stages/image"}},
    {"stages/sample", {"stages/encode"}},      // the VAE as encode/ names and holds it
    {"stages/plan", {"stages/train"}},         // the planner measures TrainStep's own steps
    {"stages/distributed", {"stages/train"}},  // it implements train's GradientSync
};

bool allowed(const std::string& from, const std::string& to) {
    if (from == to) return true;
    const std::string from_top = top_of(from), to_top = top_of(to);
    if (from_top != to_top) {
        auto it = kAllowedTop.find(from_top);
        return it != kAllowedTop.end() && it->second.count(to_top) > 0;
    }
    if (to == "model/common") return true;
    auto it = kAllowedSiblings.find(from);
    return it != kAllowedSiblings.end() && it->second.count(to) > 0;
}

struct Violation {
    std::string where;  // "path:line"
    std::string line;
};

// Every `#include "folder/..."` under `root` (tests/ excluded) that breaks the order.
std::vector<Violation> layering_violations(const fs::path& root, int& sources) {
    std::vector<Violation> found;
    for (const auto& [top, _] : kAllowedTop) {
        if (!fs::is_directory(root / top)) continue;
        for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
            const std::string ext = entry.path().extension().string();
            if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".inc")) {
                continue;
            }
            ++sources;
            const std::string rel = fs::relative(entry.path(), root).generic_string();
            const std::string from = part_of(rel);
            std::ifstream in(entry.path());
            std::string line;
            for (int number = 1; std::getline(in, line); ++number) {
                const size_t at = line.find("#include \"");
                if (at == std::string::npos) continue;
                const size_t start = at + 10, end = line.find('"', start);
                if (end == std::string::npos) continue;
                const std::string target = line.substr(start, end - start);
                const std::string to = part_of(target);
                if (to.empty() || kAllowedTop.count(top_of(to)) == 0) continue;  // not ours
                if (!allowed(from, to)) found.push_back({rel + ":" + std::to_string(number), line});
            }
        }
    }
    return found;
}

// "path:line: text" for every #include line under `dir` containing one of `needles`.
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

TEST(Layering, EveryIncludePointsDownTheDependencyOrder) {
    int sources = 0;
    const auto found = layering_violations(kSource, sources);
    EXPECT_GT(sources, 100);  // the tree was found and walked
    for (const auto& v : found) ADD_FAILURE() << v.where << ": " << v.line;
}

TEST(Layering, TheCheckerCatchesAnIncludeThatPointsUp) {
    const fs::path root =
        fs::temp_directory_path() / ("sanaflow-layering-" + std::to_string(::getpid()));
    fs::remove_all(root);
    auto write = [&](const std::string& rel, const std::string& text) {
        fs::create_directories((root / rel).parent_path());
        std::ofstream(root / rel) << text;
    };
    write("core/a.h", "#include \"core/b.h\"\n#include <vector>\n");
    write("storage/c.cpp", "#include \"core/a.h\"\n#include \"storage/c.h\"\n");
    write("model/sana/d.cpp", "#include \"model/common/w.h\"\n#include \"storage/c.h\"\n");
    int sources = 0;
    EXPECT_TRUE(layering_violations(root, sources).empty());
    EXPECT_EQ(sources, 3);

    write("storage/bad.cpp", "#include \"graph/pipeline.h\"\n");         // sideways
    write("model/bad.cpp", "#include \"stages/train/x.h\"\n");           // up
    write("model/sana/bad.h", "\n#include \"model/gemma/gemma2.h\"\n");  // another family
    write("stages/image/bad.h", "#include \"stages/train/y.h\"\n");      // another stage part
    write("core/bad.h", "#include \"pipelines/prep.h\"  // up\n");
    sources = 0;
    auto found = layering_violations(root, sources);
    std::set<std::string> where;
    for (const auto& v : found) where.insert(v.where);
    EXPECT_EQ(where, (std::set<std::string>{"core/bad.h:1", "model/bad.cpp:1", "model/sana/bad.h:2",
                                            "stages/image/bad.h:1", "storage/bad.cpp:1"}));
    fs::remove_all(root);
}

TEST(Layering, StageSourcesIncludeNoTbbHeader) {
    int sources = 0;
    auto hits = includes_matching(kSource / "stages", {"tbb/", "tbb.h", "flow_graph"}, sources);
    EXPECT_GT(sources, 0);
    for (const auto& h : hits) ADD_FAILURE() << h;
}

TEST(Layering, PipelineSourcesIncludeNoFlowGraph) {
    int sources = 0;
    auto hits = includes_matching(kSource / "pipelines", {"flow_graph"}, sources);
    EXPECT_GT(sources, 0);
    for (const auto& h : hits) ADD_FAILURE() << h;
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
}  // namespace sf
