// Content keys and fingerprints.
#include <gtest/gtest.h>

#include <fstream>

#include "storage/content_key.h"
#include "storage/fingerprint.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::TempDir;

TEST(StorageContentKey, IsStableHexOf32Chars) {
    std::string key = content_key_of("pixels", {{"size", "1024"}});
    EXPECT_EQ(key.size(), 32u);
    EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
    // Frozen: every cache ever written depends on this value.
    EXPECT_EQ(key, "27c96b5bf8a327ba4780e3041c0de98d");
}

TEST(StorageContentKey, DependsOnSourceAndParamsNotOnOrderOrChunks) {
    std::string a =
        ContentKey().add_source("abc").add_param("w", int64_t{64}).add_param("h", "32").hex();
    std::string b = ContentKey()
                        .add_param("h", "32")
                        .add_source("a")
                        .add_source("bc")
                        .add_param("w", int64_t{64})
                        .hex();
    EXPECT_EQ(a, b);
    EXPECT_NE(a, content_key_of("abd", {{"w", "64"}, {"h", "32"}}));
    EXPECT_NE(a, content_key_of("abc", {{"w", "64"}, {"h", "33"}}));
    EXPECT_NE(a, content_key_of("abc", {{"w", "64"}}));
    // Framing: moving bytes between name and value, or between source and params, changes the key.
    EXPECT_NE(content_key_of("", {{"ab", "c"}}), content_key_of("", {{"a", "bc"}}));
    EXPECT_NE(content_key_of("x", {}), content_key_of("", {{"x", ""}}));
    EXPECT_EQ(error_code_of([] { ContentKey().add_param("a", "1").add_param("a", "2"); }),
              ErrorCode::kInvalidArgument);
    EXPECT_NE(ContentKey().add_param("scale", 0.1).hex(),
              ContentKey().add_param("scale", 0.1000001).hex());
}

TEST(StorageContentKey, FileKeyFollowsContentNotName) {
    TempDir dir;
    std::string bytes(3 << 20, 'q');  // spans several read chunks
    bytes[123456] = 'z';
    {
        std::ofstream(dir.file("a.jpg"), std::ios::binary) << bytes;
        std::ofstream(dir.file("renamed.jpg"), std::ios::binary) << bytes;
    }
    std::map<std::string, std::string> params = {{"bucket", "1024x1024"}};
    std::string key = content_key_of_file(dir.file("a.jpg"), params);
    EXPECT_EQ(key, content_key_of(bytes, params));
    EXPECT_EQ(key, content_key_of_file(dir.file("renamed.jpg"), params));
    bytes[0] = 'r';
    std::ofstream(dir.file("a.jpg"), std::ios::binary) << bytes;
    EXPECT_NE(key, content_key_of_file(dir.file("a.jpg"), params));
    std::string message;
    EXPECT_EQ(error_code_of([&] { content_key_of_file(dir.file("none.jpg"), {}); }, &message),
              ErrorCode::kNotFound);
    EXPECT_NE(message.find("none.jpg"), std::string::npos);
}

TEST(StorageFingerprint, JsonRoundTripAndDiff) {
    Fingerprint f = {{"stage", "decode_image"}, {"resolution", "1024"}, {"buckets", "ab12"}};
    EXPECT_EQ(fingerprint_from_json(fingerprint_to_json(f), "x"), f);
    EXPECT_EQ(fingerprint_hash(f).size(), 32u);
    Fingerprint g = f;
    g["resolution"] = "512";
    g.erase("buckets");
    EXPECT_NE(fingerprint_hash(f), fingerprint_hash(g));
    EXPECT_EQ(fingerprint_diff(f, g),
              (std::vector<std::string>{"buckets: cache has ab12, run wants nothing",
                                        "resolution: cache has 1024, run wants 512"}));
    EXPECT_NO_THROW(check_fingerprint(f, f));
    std::string message;
    EXPECT_EQ(error_code_of([&] { check_fingerprint(f, g, "decode_image", "/c"); }, &message),
              ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("stage 'decode_image'"), std::string::npos) << message;
    EXPECT_NE(message.find("--rebuild"), std::string::npos) << message;
    EXPECT_EQ(error_code_of([] { fingerprint_from_json("[1]", "x"); }), ErrorCode::kCorruption);
    EXPECT_EQ(error_code_of([] { fingerprint_from_json("{\"a\":1}", "x"); }),
              ErrorCode::kCorruption);
}

}  // namespace
}  // namespace sf::storage
