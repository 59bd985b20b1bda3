// Dataset scanning: caption files, JSONL manifests, instance prompts, Unicode, and reject
// reasons that name the file and line. The "images" here are never decoded, so any bytes do.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "stages/image/dataset.h"
#include "storage/cache_schema.h"
#include "tests/stages_test_util.h"

namespace sf::stages {
namespace {

using test::write_file;

std::vector<std::string> paths_of(const DatasetScan& scan) {
    std::vector<std::string> out;
    for (const Sample& s : scan.samples) out.push_back(s.path);
    return out;
}

std::string caption_of(const DatasetScan& scan, const std::string& path) {
    for (const Sample& s : scan.samples) {
        if (s.path == path) return s.caption;
    }
    return "<absent>";
}

// A folder with every case folder mode must handle.
class DatasetFolder : public ::testing::Test {
protected:
    void SetUp() override {
        write_file(dir_.path() / "b.png", "img");
        write_file(dir_.path() / "b.txt", "  a red bird\n");
        write_file(dir_.path() / "a.jpg", "img");
        write_file(dir_.path() / "a.txt",
                   "\xEF\xBB\xBF"
                   "a cat\r\n");                    // BOM, CRLF
        write_file(dir_.path() / "c.png", "img");   // no caption
        write_file(dir_.path() / "D.JPEG", "img");  // upper-case extension
        write_file(dir_.path() / "D.txt", "upper");
        write_file(dir_.path() / "notes.txt", "a caption with no image is ignored");
        write_file(dir_.path() / "anim.gif", "not in the extension list");
        write_file(dir_.path() / ".hidden.png", "skipped");
        write_file(dir_.path() / ".cache" / "x.png", "skipped with its folder");
        write_file(dir_.path() / "sub" / "e.webp", "img");
        write_file(dir_.path() / "sub" / "e.txt", "nested");
        write_file(dir_.path() / "empty.png", "img");
        write_file(dir_.path() / "empty.txt", " \n\t ");
        write_file(dir_.path() / "latin1.png", "img");
        write_file(dir_.path() / "latin1.txt", "caf\xE9");  // not UTF-8
    }
    std::string p(const std::string& name) const { return (dir_.path() / name).string(); }
    DatasetConfig config() const {
        DatasetConfig c;
        c.instance_data_dir = dir_.path().string();
        return c;
    }
    test::TempDir dir_;
};

TEST_F(DatasetFolder, CaptionFilesSortedWithRejects) {
    const DatasetScan scan = scan_dataset(config());
    EXPECT_EQ(paths_of(scan),
              (std::vector<std::string>{p("D.JPEG"), p("a.jpg"), p("b.png"), p("sub/e.webp")}));
    EXPECT_EQ(caption_of(scan, p("a.jpg")), "a cat");
    EXPECT_EQ(caption_of(scan, p("b.png")), "a red bird");
    EXPECT_EQ(caption_of(scan, p("sub/e.webp")), "nested");
    EXPECT_TRUE(scan.manifest_used.empty());
    using Reject = std::pair<std::string, std::string>;
    EXPECT_EQ(scan.rejects, (std::vector<Reject>{
                                {p("c.png"), "no caption file c.txt"},
                                {p("empty.png"), "caption file empty.txt is empty"},
                                {p("latin1.png"), "caption file latin1.txt is not valid UTF-8"},
                            }));
}

TEST_F(DatasetFolder, NonRecursiveAndCustomExtensions) {
    DatasetConfig c = config();
    c.recursive = false;
    c.extensions = {".PNG"};
    const DatasetScan scan = scan_dataset(c);
    EXPECT_EQ(paths_of(scan), (std::vector<std::string>{p("b.png")}));
    EXPECT_EQ(scan.rejects.size(), 3u);  // c, empty, latin1
}

TEST_F(DatasetFolder, InstancePromptCaptionsEveryImage) {
    DatasetConfig c = config();
    c.instance_prompt = " a photo of sks dog ";
    const DatasetScan scan = scan_dataset(c);
    EXPECT_EQ(scan.samples.size(), 7u);  // a, b, c, D, e, empty, latin1
    EXPECT_TRUE(scan.rejects.empty());
    for (const Sample& s : scan.samples) EXPECT_EQ(s.caption, "a photo of sks dog") << s.path;
}

TEST(Dataset, UnicodeNamesAndCaptions) {
    test::TempDir dir;
    const std::string caption = "a 🐱 on a café terrace — 日本語, naïve";
    write_file(dir.path() / "café_日本.png", "img");
    write_file(dir.path() / "café_日本.txt", caption + "\n");
    write_file(dir.path() / "Ελληνικά" / "😀.jpg", "img");
    write_file(dir.path() / "Ελληνικά" / "😀.txt", "emoji folder");
    DatasetConfig c;
    c.instance_data_dir = dir.path().string();
    const DatasetScan scan = scan_dataset(c);
    ASSERT_EQ(scan.samples.size(), 2u);
    EXPECT_EQ(caption_of(scan, dir.file("café_日本.png")), caption);
    EXPECT_EQ(caption_of(scan, dir.file("Ελληνικά/😀.jpg")), "emoji folder");
    EXPECT_TRUE(scan.rejects.empty());
}

TEST(Dataset, ManifestLinesAndRejectsNamingFileAndLine) {
    test::TempDir dir;
    write_file(dir.path() / "imgs" / "one.png", "img");
    write_file(dir.path() / "imgs" / "two.png", "img");
    write_file(dir.path() / "imgs" / "日本.png", "img");
    write_file(dir.path() / "abs.png", "img");
    const std::string manifest = dir.file("data/train.jsonl");
    const std::string lines[] = {
        R"({"file": "../imgs/two.png", "caption": "second"})",              // 1
        R"({"file": "../imgs/one.png", "caption": "  first  "})",           // 2
        R"({"file": "../imgs/one.png", "caption": "again"})",               // 3 duplicate
        R"({"file": "../imgs/three.png", "caption": "x"})",                 // 4 missing file
        R"({"file": "../imgs/two.png" "caption": "x"})",                    // 5 bad JSON
        "",                                                                 // 6 blank
        R"({"file": "../imgs/日本.png", "text": "Unicode 🐱"})",             // 7 imagefolder alias
        R"({"file": ")" + dir.file("abs.png") + R"(", "caption": "abs"})",  // 8 absolute
        R"({"file": "../imgs/two.png"})",                                   // 9 no caption
        R"(["not", "an", "object"])",                                       // 10
        R"({"caption": "no file"})",                                        // 11
        R"({"file": "../imgs/one.png", "caption": "   "})",                 // 12 empty caption
    };
    std::string text;
    for (const std::string& line : lines) text += line + "\r\n";
    write_file(manifest, text);

    DatasetConfig c;
    c.manifest = manifest;
    const DatasetScan scan = scan_dataset(c);
    EXPECT_EQ(scan.manifest_used, manifest);
    EXPECT_EQ(paths_of(scan),
              (std::vector<std::string>{dir.file("abs.png"), dir.file("imgs/one.png"),
                                        dir.file("imgs/two.png"), dir.file("imgs/日本.png")}));
    EXPECT_EQ(caption_of(scan, dir.file("imgs/one.png")), "first");
    EXPECT_EQ(caption_of(scan, dir.file("imgs/日本.png")), "Unicode 🐱");
    ASSERT_EQ(scan.rejects.size(), 7u);
    auto expect_reject = [&](size_t i, int line, const std::string& reason_start) {
        EXPECT_EQ(scan.rejects[i].first, manifest + ":" + std::to_string(line));
        EXPECT_EQ(scan.rejects[i].second.rfind(reason_start, 0), 0u) << scan.rejects[i].second;
    };
    expect_reject(0, 3, "duplicate of line 2: " + dir.file("imgs/one.png"));
    expect_reject(1, 4, "file not found: " + dir.file("imgs/three.png"));
    expect_reject(2, 5, "metadata line: not valid JSON: ");
    expect_reject(3, 9, "no \"caption\", \"text\" or \"prompt\" string");
    expect_reject(4, 10, "line is not a JSON object");
    expect_reject(5, 11, "no \"file\" string");
    expect_reject(6, 12, "empty caption");

    c.instance_prompt = "sks";  // every caption replaced; missing captions no longer matter
    const DatasetScan prompted = scan_dataset(c);
    EXPECT_EQ(prompted.samples.size(), 4u);
    for (const Sample& s : prompted.samples) EXPECT_EQ(s.caption, "sks");
}

TEST(Dataset, MetadataJsonlInTheFolderIsUsed) {
    test::TempDir dir;
    write_file(dir.path() / "a.png", "img");
    write_file(dir.path() / "b.png", "img");  // not listed: the manifest decides
    write_file(dir.path() / "metadata.jsonl", R"({"file_name": "a.png", "text": "from meta"})");
    DatasetConfig c;
    c.instance_data_dir = dir.path().string();
    const DatasetScan scan = scan_dataset(c);
    EXPECT_EQ(scan.manifest_used, dir.file("metadata.jsonl"));
    ASSERT_EQ(scan.samples.size(), 1u);
    EXPECT_EQ(scan.samples[0].caption, "from meta");
    // "prompt" is a caption column too; --caption_column picks another, naming it when missing.
    write_file(dir.path() / "metadata.jsonl",
               "{\"file_name\": \"a.png\", \"prompt\": \"a prompt\", \"alt\": \"alt text\"}\n"
               "{\"file_name\": \"b.png\", \"prompt\": \"b prompt\"}\n");
    EXPECT_EQ(scan_dataset(c).samples.at(0).caption, "a prompt");
    c.caption_column = "alt";
    const DatasetScan alt = scan_dataset(c);
    ASSERT_EQ(alt.samples.size(), 1u);
    EXPECT_EQ(alt.samples[0].caption, "alt text");
    ASSERT_EQ(alt.rejects.size(), 1u);
    EXPECT_NE(alt.rejects[0].second.find("no \"alt\" string (--caption_column)"), std::string::npos)
        << alt.rejects[0].second;
}

TEST(Dataset, MissingInputsAreErrorsNamingThem) {
    auto error_of = [](const DatasetConfig& c) -> std::pair<ErrorCode, std::string> {
        try {
            scan_dataset(c);
        } catch (const Error& e) {
            return {e.code(), e.what()};
        }
        return {ErrorCode::kIOError, "no error"};
    };
    test::TempDir dir;
    DatasetConfig c;
    EXPECT_EQ(error_of(c).first, ErrorCode::kInvalidArgument);
    c.instance_data_dir = dir.file("nope");
    auto [code, message] = error_of(c);
    EXPECT_EQ(code, ErrorCode::kNotFound);
    EXPECT_NE(message.find(dir.file("nope")), std::string::npos) << message;
    write_file(dir.path() / "file", "x");
    c.instance_data_dir = dir.file("file");
    EXPECT_EQ(error_of(c).first, ErrorCode::kInvalidArgument);
    c = {};
    c.manifest = dir.file("missing.jsonl");
    std::tie(code, message) = error_of(c);
    EXPECT_EQ(code, ErrorCode::kNotFound);
    EXPECT_NE(message.find("missing.jsonl"), std::string::npos) << message;
}

TEST(Dataset, CaptionBytes) {
    std::string caption;
    EXPECT_TRUE(caption_from_bytes("\xEF\xBB\xBF  x y \n", &caption));
    EXPECT_EQ(caption, "x y");
    EXPECT_FALSE(caption_from_bytes("\xC0\xAF", &caption));          // overlong '/'
    EXPECT_FALSE(caption_from_bytes("\xED\xA0\x80", &caption));      // surrogate
    EXPECT_FALSE(caption_from_bytes("\xF4\x90\x80\x80", &caption));  // above U+10FFFF
    EXPECT_FALSE(caption_from_bytes("abc\xE6\x97", &caption));       // cut multi-byte
    EXPECT_TRUE(caption_from_bytes("🐱", &caption));
    EXPECT_EQ(caption, "🐱");
}

// Names and captions the cache cannot hold are rejected samples, and the scan goes on.
TEST(Dataset, NonUtf8NamesAndOverlongCaptionsAreRejects) {
    test::TempDir dir;
    write_file(dir.path() / "good.png", "img");
    write_file(dir.path() / "good.txt", "fine");
    write_file(dir.path() / "caf\xE9.png", "img");  // Latin-1, not UTF-8
    write_file(dir.path() / "caf\xE9.txt", "a cafe");
    write_file(dir.path() / "long.png", "img");
    write_file(dir.path() / "long.txt", std::string(storage::schema::kMaxCaptionBytes + 1, 'w'));
    DatasetConfig c;
    c.instance_data_dir = dir.path().string();
    const DatasetScan scan = scan_dataset(c);
    EXPECT_EQ(paths_of(scan), std::vector<std::string>{dir.file("good.png")});
    ASSERT_EQ(scan.rejects.size(), 2u);
    std::map<std::string, std::string> reasons(scan.rejects.begin(), scan.rejects.end());
    EXPECT_EQ(reasons[dir.file("caf\\xE9.png")],
              "file name is not valid UTF-8 (bytes shown as \\xNN)");
    EXPECT_EQ(
        reasons[dir.file("long.png")].rfind("caption of 65537 bytes is over the limit of 65536", 0),
        0u);
    // The same limit for manifest captions and the instance prompt.
    write_file(dir.path() / "metadata.jsonl",
               "{\"file\": \"good.png\", \"caption\": \"" + std::string(70000, 'm') + "\"}\n" +
                   "{\"file\": \"long.png\", \"caption\": " + std::string(100000, '[') + "}\n");
    const DatasetScan manifest = scan_dataset(c);
    EXPECT_TRUE(manifest.samples.empty());
    ASSERT_EQ(manifest.rejects.size(), 2u);
    EXPECT_EQ(manifest.rejects[0].first, dir.file("metadata.jsonl") + ":2");
    EXPECT_EQ(manifest.rejects[0].second, "metadata line: JSON nested deeper than 64 levels");
    EXPECT_EQ(manifest.rejects[1].first, dir.file("good.png"));
    EXPECT_NE(manifest.rejects[1].second.find("over the limit"), std::string::npos);
    c.instance_prompt = std::string(70000, 'p');
    test::expect_error([&] { scan_dataset(c); }, ErrorCode::kInvalidArgument,
                       "instance_prompt: caption of 70000 bytes");
}

}  // namespace
}  // namespace sf::stages
