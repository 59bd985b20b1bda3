// The cache schema: bucket names both ways, the sample and manifest records round-trip and
// refuse what is missing, and docs/cache-format.md lists every on-disk name the schema holds.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "storage/cache_schema.h"
#include "test_util.h"

namespace sf::storage::schema {
namespace {

TEST(CacheSchema, BucketNamesRoundTripForImagesAndVideo) {
    EXPECT_EQ((Bucket{1, 1024, 768}.name()), "1024x768");
    EXPECT_EQ((Bucket{81, 480, 832}.name()), "81x480x832");
    for (const Bucket b : {Bucket{1, 512, 512}, Bucket{1, 384, 1024}, Bucket{21, 480, 832}}) {
        EXPECT_EQ(Bucket::parse(b.name(), "test"), b) << b.name();
    }
    for (const char* bad : {"", "1024", "1024x", "x768", "0x512", "12x34x56x78", "1024x76a", "-4x4",
                            "99999999999x2"}) {
        const std::string m = test::error_of([&] { Bucket::parse(bad, "samples/k1"); });
        EXPECT_NE(m.find("samples/k1"), std::string::npos) << bad << ": " << m;
    }
    // Buckets order by name, as the "HxW" strings did before buckets had a type.
    EXPECT_LT((Bucket{1, 1024, 512}), (Bucket{1, 512, 1024}));
}

TEST(CacheSchema, SampleRecordRoundTripsAndNamesWhatIsMissing) {
    SampleRecord s;
    s.source = "data/cat.jpg";
    s.caption = "a cat";
    s.bucket = {1, 1024, 768};
    s.bucket_ratio = "1.33";
    s.original_height = 3000;
    s.original_width = 4000;
    s.latent_key = "0123";
    s.text_key = "4567";
    s.fingerprint = "89ab";
    const Record r = s.to_record();
    EXPECT_EQ(r.metadata.at(kStage), kDecodeImageStage);
    const SampleRecord back = SampleRecord::from_record(r, "samples/x");
    EXPECT_EQ(back.source, s.source);
    EXPECT_EQ(back.caption, s.caption);
    EXPECT_EQ(back.bucket, s.bucket);
    EXPECT_EQ(back.bucket_ratio, s.bucket_ratio);
    EXPECT_EQ(back.original_height, 3000);
    EXPECT_EQ(back.original_width, 4000);
    EXPECT_EQ(back.latent_key, s.latent_key);
    EXPECT_EQ(back.text_key, s.text_key);
    EXPECT_EQ(back.fingerprint, s.fingerprint);
    EXPECT_EQ(back.to_record(), r);

    for (const char* key : {kLatentKey, kTextKey, kBucket}) {
        Record broken = r;
        broken.metadata.erase(key);
        const std::string m =
            test::error_of([&] { SampleRecord::from_record(broken, "samples/x"); });
        EXPECT_NE(m.find(std::string("'") + key + "' missing"), std::string::npos) << m;
    }
    Record broken = r;
    broken.tensors.erase(kOriginalSize);
    EXPECT_NE(
        test::error_of([&] { SampleRecord::from_record(broken, "samples/x"); }).find(kOriginalSize),
        std::string::npos);
}

TEST(CacheSchema, ManifestRoundTripsAndRefusesATruncatedList) {
    const std::vector<std::string> keys = {"aa", "bb", "cc"};
    const Record r = manifest_record(keys);
    EXPECT_EQ(r.metadata.at(kCount), "3");
    EXPECT_EQ(manifest_keys(r, "manifest"), keys);
    EXPECT_TRUE(manifest_keys(manifest_record({}), "manifest").empty());
    Record cut = r;
    cut.tensors.at(kManifestKeys).bytes.pop_back();  // "cc" without its newline
    cut.tensors.at(kManifestKeys).shape = {
        static_cast<int64_t>(cut.tensors.at(kManifestKeys).bytes.size())};
    EXPECT_THROW(manifest_keys(cut, "manifest"), Error);
}

// Every `constexpr const char* kName = "value";` of the schema header appears in the format
// document as `value`: a name added to the schema without documenting it fails here.
TEST(CacheSchema, TheFormatDocumentListsEveryName) {
    std::ifstream header(std::string(SANAFLOW_SOURCE_DIR) + "/storage/cache_schema.h");
    std::ifstream doc_file(std::string(SANAFLOW_SOURCE_DIR) + "/docs/cache-format.md");
    ASSERT_TRUE(header && doc_file);
    std::stringstream doc;
    doc << doc_file.rdbuf();
    const std::regex name(R"re(constexpr const char\* (k\w+) = "([^"]+)";)re");
    std::string line;
    int names = 0;
    while (std::getline(header, line)) {
        std::smatch m;
        if (!std::regex_search(line, m, name)) continue;
        ++names;
        EXPECT_NE(doc.str().find("`" + m[2].str() + "`"), std::string::npos)
            << m[1] << " = \"" << m[2] << "\" is not in docs/cache-format.md";
    }
    EXPECT_GT(names, 25);
}

}  // namespace
}  // namespace sf::storage::schema
