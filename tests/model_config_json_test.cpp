// The config.json reader the model configs share: finding and parsing the file (a directory
// means its config.json; missing, unreadable, bad JSON, not an object, nested too deep), the class
// check, each typed read naming the file and the key, and long values cut short in messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/common/config_json.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "model/gemma/gemma2_config.h"
#include "model/sana/sana_config.h"
#include "model/sana_video/sana_video_config.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using sf::ErrorCode;
using sf::model::ConfigReader;
using sf::model::json_excerpt;
using sf::model::parse_config_json;
using sf::model::read_config_file;
using sf::test::error_of;

// The category and message of the sf::Error that `f` throws.
struct Thrown {
    std::optional<ErrorCode> code;
    std::string message;
};

Thrown thrown_by(const std::function<void()>& f) {
    try {
        f();
    } catch (const sf::Error& e) {
        return {e.code(), e.what()};
    }
    return {std::nullopt, "(no error)"};
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

TEST(ConfigJson, MissingFileIsNotFoundNamingIt) {
    sf::test::TempDir tmp("sf_config_json");
    const std::string file = tmp.file("absent.json");
    const Thrown t = thrown_by([&] { read_config_file(file, "test config"); });
    EXPECT_EQ(t.code, ErrorCode::kNotFound) << t.message;
    EXPECT_TRUE(contains(t.message, "test config " + file + " not found")) << t.message;
    // A directory without config.json names the file it looked for.
    const Thrown empty_dir = thrown_by([&] { read_config_file(tmp.path().string(), "vae"); });
    EXPECT_EQ(empty_dir.code, ErrorCode::kNotFound) << empty_dir.message;
    EXPECT_TRUE(contains(empty_dir.message, tmp.file("config.json"))) << empty_dir.message;
}

TEST(ConfigJson, ADirectoryMeansItsConfigJson) {
    sf::test::TempDir tmp("sf_config_json");
    sf::test::write_file(tmp.file("config.json"), R"({"num_layers": 3})");
    const auto from_dir = read_config_file(tmp.path().string(), "test config");
    EXPECT_EQ(from_dir.path, tmp.file("config.json"));
    EXPECT_EQ(from_dir.json.at("num_layers"), 3);
    const auto from_file = read_config_file(tmp.file("config.json"), "test config");
    EXPECT_EQ(from_file.path, tmp.file("config.json"));
    EXPECT_EQ(from_file.json, from_dir.json);
}

TEST(ConfigJson, AnUnreadableFileIsAnIOError) {
    sf::test::TempDir tmp("sf_config_json");
    // config.json that is a directory exists but cannot be read as a file.
    std::filesystem::create_directories(tmp.path() / "config.json");
    const Thrown t = thrown_by([&] { read_config_file(tmp.path().string(), "test config"); });
    EXPECT_EQ(t.code, ErrorCode::kIOError) << t.message;
    EXPECT_TRUE(contains(t.message, tmp.file("config.json"))) << t.message;

    // Without read permission (root reads it anyway, so only checked for other users).
    const std::string file = tmp.file("locked.json");
    sf::test::write_file(file, "{}");
    std::filesystem::permissions(file, std::filesystem::perms::none);
    if (::geteuid() != 0) {
        const Thrown locked = thrown_by([&] { read_config_file(file, "test config"); });
        EXPECT_EQ(locked.code, ErrorCode::kIOError) << locked.message;
        EXPECT_TRUE(contains(locked.message, file)) << locked.message;
    }
}

TEST(ConfigJson, BadJsonAndNotAnObjectNameTheFile) {
    sf::test::TempDir tmp("sf_config_json");
    const std::string file = tmp.file("config.json");
    for (const char* text : {"{not json", "", "{\"a\": 1} trailing"}) {
        sf::test::write_file(file, text);
        const Thrown t = thrown_by([&] { read_config_file(file, "test config"); });
        EXPECT_EQ(t.code, ErrorCode::kInvalidArgument) << t.message;
        EXPECT_TRUE(contains(t.message, file + ": not valid JSON")) << t.message;
    }
    for (const char* text : {"[1, 2]", "3", "\"text\"", "null"}) {
        sf::test::write_file(file, text);
        const Thrown t = thrown_by([&] { read_config_file(file, "test config"); });
        EXPECT_EQ(t.code, ErrorCode::kInvalidArgument) << t.message;
        EXPECT_TRUE(contains(t.message, file + ": not a JSON object")) << t.message;
    }
    // The parser quotes the token it failed in: a long one is cut short.
    const std::string long_token = "{\"a\": \"" + std::string(100000, 'x') + "\x01\"}";
    const std::string message = error_of([&] { parse_config_json(long_token, "x.json"); });
    EXPECT_TRUE(contains(message, "x.json: not valid JSON")) << message;
    EXPECT_LT(message.size(), 400u);
}

// Python's json.dump writes non-finite floats as bare words (diffusers' scheduler configs hold
// "lambda_min_clipped": -Infinity): they read as null, the same words inside strings as they are.
TEST(ConfigJson, PythonsNonFiniteFloatsReadAsNull) {
    const auto j = parse_config_json(
        R"({"a": -Infinity, "b": [Infinity, NaN, 1.5], "c": "NaN -Infinity \" Infinity"})",
        "x.json");
    EXPECT_TRUE(j.at("a").is_null());
    EXPECT_TRUE(j.at("b").at(0).is_null());
    EXPECT_TRUE(j.at("b").at(1).is_null());
    EXPECT_EQ(j.at("b").at(2).get<double>(), 1.5);
    EXPECT_EQ(j.at("c").get<std::string>(), "NaN -Infinity \" Infinity");
    EXPECT_TRUE(contains(error_of([] { parse_config_json(R"({"a": -Inf})", "x.json"); }),
                         "x.json: not valid JSON"));
}

TEST(ConfigJson, ClassNameIsCheckedWhenPresent) {
    const json other = {{"_class_name", "AutoencoderDC"}};
    const Thrown t = thrown_by(
        [&] { ConfigReader(other, "x.json").check_class_name("SanaTransformer2DModel"); });
    EXPECT_EQ(t.code, ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(
        t.message, R"(x.json: "_class_name" is "AutoencoderDC", not "SanaTransformer2DModel")"))
        << t.message;
    EXPECT_NO_THROW(ConfigReader(json::object(), "x.json").check_class_name("AutoencoderDC"));
    EXPECT_NO_THROW(ConfigReader(other, "x.json").check_class_name("AutoencoderDC"));
    EXPECT_TRUE(contains(error_of([] {
                             ConfigReader({{"_class_name", 3}}, "x.json").check_class_name("A");
                         }),
                         R"("_class_name" is 3, not "A")"));
    // Each config checks its own class, so one model's file is not read as another's.
    sf::test::TempDir tmp("sf_config_json");
    const std::string file = tmp.file("config.json");
    sf::test::write_file(file, R"({"_class_name": "SanaTransformer2DModel"})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::AutoencoderDCConfig::from_json_file(file); }),
                         file + R"(: "_class_name" is "SanaTransformer2DModel", not)"));
    sf::test::write_file(file, R"({"_class_name": "AutoencoderDC"})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::SanaTransformerConfig::from_json_file(file); }),
                         file + R"(: "_class_name" is "AutoencoderDC", not)"));
    sf::test::write_file(file, R"({"model_type": "llama"})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::Gemma2Config::from_json_file(file); }),
                         file + R"(: "model_type" is "llama", not "gemma2")"));
}

TEST(ConfigJson, MissingKeysKeepTheDefaultAndNullResetsAnOptional) {
    const json j = {{"n", 7},          {"x", 2},
                    {"none", nullptr}, {"s", "text"},
                    {"list", {1, -2}}, {"lists", {json::array(), {3}}},
                    {"b", false},      {"names", {"a", "b"}}};
    const ConfigReader r(j, "x.json");
    int64_t n = 1, absent = 5;
    r.integer("n", n);
    r.integer("absent", absent);
    EXPECT_EQ(n, 7);
    EXPECT_EQ(absent, 5);
    double x = 0.5;
    r.number("x", x);  // an integer is a number
    EXPECT_EQ(x, 2.0);
    bool b = true;
    r.boolean("b", b);
    EXPECT_FALSE(b);
    std::string s;
    r.string("s", s);
    EXPECT_EQ(s, "text");
    std::optional<int64_t> oi = 4;
    std::optional<double> od = 4.0;
    std::optional<std::string> os = "kept";
    r.nullable_integer("none", oi);
    r.nullable_number("none", od);
    r.nullable_string("absent", os);
    EXPECT_FALSE(oi.has_value());
    EXPECT_FALSE(od.has_value());
    EXPECT_EQ(os, "kept");
    r.nullable_integer("n", oi);
    EXPECT_EQ(oi, 7);
    std::vector<int64_t> list;
    r.integer_list("list", list);
    EXPECT_EQ(list, (std::vector<int64_t>{1, -2}));
    std::vector<std::vector<int64_t>> lists;
    r.integer_lists("lists", lists);
    EXPECT_EQ(lists, (std::vector<std::vector<int64_t>>{{}, {3}}));
    std::vector<std::string> names;
    r.string_list("names", names);
    EXPECT_EQ(names, (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(r.has_value("n"));
    EXPECT_FALSE(r.has_value("none"));
    EXPECT_FALSE(r.has_value("absent"));
    // An absent object reads as an empty one: every inner key keeps its default.
    int64_t inner = 9;
    r.object("absent").integer("k", inner);
    EXPECT_EQ(inner, 9);
}

TEST(ConfigJson, EachWrongTypeNamesTheFileAndTheKey) {
    const json j = {{"str", "2"},          {"num", 1.5},        {"int", 2},
                    {"boolean", true},     {"mixed", {1, "a"}}, {"flat", {1, 2}},
                    {"obj", {{"k", "v"}}}, {"null", nullptr},   {"huge", 9223372036854775808u}};
    const ConfigReader r(j, "dir/config.json");
    int64_t i = 0;
    double d = 0;
    bool b = false;
    std::string s;
    std::optional<int64_t> oi;
    std::optional<double> od;
    std::optional<std::string> os;
    std::vector<int64_t> il;
    std::vector<std::vector<int64_t>> ill;
    std::vector<std::string> sl;
    const std::vector<std::pair<std::function<void()>, std::string>> cases = {
        {[&] { r.integer("str", i); }, R"("str" must be an integer, got "2")"},
        {[&] { r.integer("num", i); }, R"("num" must be an integer, got 1.5)"},
        {[&] { r.integer("null", i); }, R"("null" must be an integer, got null)"},
        {[&] { r.integer("huge", i); },
         R"("huge" must be an integer of magnitude at most 2^31 - 1, got 9223372036854775808)"},
        {[&] { r.number("boolean", d); }, R"("boolean" must be a number, got true)"},
        {[&] { r.boolean("int", b); }, R"("int" must be true or false, got 2)"},
        {[&] { r.string("int", s); }, R"("int" must be a string, got 2)"},
        {[&] { r.nullable_integer("num", oi); }, R"("num" must be an integer or null, got 1.5)"},
        {[&] { r.nullable_number("str", od); }, R"("str" must be a number or null, got "2")"},
        {[&] { r.nullable_string("int", os); }, R"("int" must be a string or null, got 2)"},
        {[&] { r.integer_list("mixed", il); },
         R"("mixed" must be a list of integers, got [1,"a"])"},
        {[&] { r.integer_list("int", il); }, R"("int" must be a list of integers, got 2)"},
        {[&] { r.integer_lists("flat", ill); },
         R"("flat" must be a list of lists of integers, got [1,2])"},
        {[&] { r.string_list("mixed", sl); }, R"("mixed" must be a list of strings, got [1,"a"])"},
        {[&] { r.object("str"); }, R"("str" must be an object, got "2")"},
        {[&] { r.object("obj").integer("k", i); }, R"("obj.k" must be an integer, got "v")"},
    };
    for (const auto& [call, expected] : cases) {
        const Thrown t = thrown_by(call);
        EXPECT_EQ(t.code, ErrorCode::kInvalidArgument) << t.message;
        EXPECT_TRUE(contains(t.message, "dir/config.json: " + expected)) << t.message;
    }
    // The bound is inclusive on both sides; one past it is refused.
    r.integer("int", i);
    int64_t max = 0;
    ConfigReader({{"max", 2147483647}, {"min", -2147483647}}, "x.json").integer("max", max);
    EXPECT_EQ(max, 2147483647);
    ConfigReader({{"min", -2147483647}}, "x.json").integer("min", max);
    EXPECT_EQ(max, -2147483647);
    EXPECT_TRUE(
        contains(error_of([&] {
                     ConfigReader({{"n", 2147483648}}, "x.json").integer("n", max);
                 }),
                 R"("n" must be an integer of magnitude at most 2^31 - 1, got 2147483648)"));
    EXPECT_TRUE(contains(error_of([] { ConfigReader(json::array(), "x.json"); }),
                         "x.json: not a JSON object"));
}

TEST(ConfigJson, TheConfigsReportWrongTypesTheSameWay) {
    sf::test::TempDir tmp("sf_config_json");
    const std::string file = tmp.file("config.json");
    sf::test::write_file(file, R"({"num_layers": "2"})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::SanaTransformerConfig::from_json_file(file); }),
                         file + R"(: "num_layers" must be an integer, got "2")"));
    sf::test::write_file(file, R"({"latent_channels": "8"})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::AutoencoderDCConfig::from_json_file(file); }),
                         file + R"(: "latent_channels" must be an integer, got "8")"));
    sf::test::write_file(file, R"({"decoder_act_fns": ["silu", 3]})");
    EXPECT_TRUE(contains(
        error_of([&] { sf::model::AutoencoderDCConfig::from_json_file(file); }),
        file + R"(: "decoder_act_fns" must be a string or a list of strings, got ["silu",3])"));
    sf::test::write_file(file, R"({"rope_parameters": {"rope_theta": "big"}})");
    EXPECT_TRUE(contains(error_of([&] { sf::model::Gemma2Config::from_json_file(file); }),
                         file + R"(: "rope_parameters.rope_theta" must be a number, got "big")"));
}

// Sizes whose products pass 2^63 are refused naming the file, never wrapped: a fuzzer found
// {"vocab_size": 466000000000060071} overflowing the Gemma-2 parameter count (undefined behaviour).
TEST(ConfigJson, SizesThatOverflowAParameterCountAreRefused) {
    const std::string where = "fuzzed/config.json";
    const std::string gemma = error_of([&] {
        sf::model::Gemma2Config::from_json(
            parse_config_json(R"({"vocab_size": 466000000000060071})", where), where);
    });
    EXPECT_TRUE(contains(
        gemma,
        where +
            R"(: "vocab_size" must be an integer of magnitude at most 2^31 - 1, got 466000000000060071)"))
        << gemma;
    // Each size in range, their product not: the count refuses, naming the file.
    const std::string big =
        R"({"vocab_size": 2147483647, "hidden_size": 2147483647, "intermediate_size": 2147483647, "num_hidden_layers": 2147483647, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 2})";
    const Thrown count = thrown_by(
        [&] { sf::model::Gemma2Config::from_json(parse_config_json(big, where), where); });
    EXPECT_EQ(count.code, ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(count.message, where + ": the config's sizes are too large"))
        << count.message;

    const std::string sana = error_of([&] {
        sf::model::SanaTransformerConfig::from_json(
            R"({"num_attention_heads": 65536, "attention_head_dim": 65536, "cross_attention_dim": 4294967296, "num_layers": 2147483647})",
            where);
    });
    EXPECT_TRUE(
        contains(sana, where + R"(: "cross_attention_dim" must be an integer of magnitude)"))
        << sana;
    const std::string sana_count = error_of([&] {
        sf::model::SanaTransformerConfig::from_json(
            R"({"num_attention_heads": 32768, "attention_head_dim": 65536, "cross_attention_dim": 2147483648, "num_layers": 2147483647})",
            where);
    });
    EXPECT_TRUE(contains(sana_count, "must be an integer of magnitude")) << sana_count;
    const std::string layers = error_of([&] {
        sf::model::SanaTransformerConfig::from_json(
            R"({"num_attention_heads": 1024, "attention_head_dim": 1024, "cross_attention_dim": 1048576, "num_layers": 2147483647, "caption_channels": 2147483647})",
            where);
    });
    EXPECT_TRUE(contains(layers, where + ": the config's sizes are too large")) << layers;
    // A huge but finite mlp_ratio is refused before the feed-forward width is cast to an integer.
    const std::string ratio = error_of(
        [&] { sf::model::SanaTransformerConfig::from_json(R"({"mlp_ratio": 1e300})", where); });
    EXPECT_TRUE(contains(ratio, where + ": mlp_ratio must give a positive feed-forward width"))
        << ratio;
    const std::string video = error_of([&] {
        sf::model::SanaVideoTransformerConfig::from_json(
            R"({"patch_size": [2147483647, 2147483647, 2147483647]})", where);
    });
    EXPECT_TRUE(contains(video, where + ": patch_size must list sizes in [1, 1024]")) << video;
}

TEST(ConfigJson, AValueTooLongToPrintIsCutShort) {
    const std::string long_string(100000, 'x');
    const json j = {{"name", long_string}, {"list", json(std::vector<int>(100000, 7))}};
    for (const char* key : {"name", "list"}) {
        const std::string message = error_of([&] {
            int64_t n = 0;
            ConfigReader(j, "x.json").integer(key, n);
        });
        EXPECT_TRUE(contains(message, std::string("x.json: \"") + key + "\" must be an integer"))
            << message;
        EXPECT_TRUE(contains(message, "...")) << message;
        EXPECT_LT(message.size(), 200u) << message;
    }
    EXPECT_EQ(json_excerpt(json(long_string)), "\"" + std::string(79, 'x') + "...");
    // Short values read as dump() writes them.
    const json small = {{"a", {1, 2.5, {{"b", nullptr}}}}, {"c", "d\"e"}};
    EXPECT_EQ(json_excerpt(small), small.dump());
    // Not cut inside a UTF-8 character: the excerpt is still valid UTF-8 (dump() would throw).
    std::string accents;
    for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";  // é
    const std::string excerpt = json_excerpt(json(accents));
    EXPECT_EQ(excerpt, "\"" + accents.substr(0, 78) + "...");
    EXPECT_NO_THROW(json(excerpt).dump());
    // Deeply nested values are cut without recursing through every level.
    json deep = json::array();
    for (int i = 0; i < 10000; ++i) deep = json::array({std::move(deep)});
    EXPECT_EQ(json_excerpt(deep, 10), std::string(10, '[') + "...");
}

// `n` levels of `open` around `inner`, closed by `n` of `close` when `closed`.
std::string nested(size_t n, const std::string& open, const std::string& inner,
                   const std::string& close, bool closed = true) {
    std::string text;
    text.reserve(n * (open.size() + close.size()) + inner.size());
    for (size_t i = 0; i < n; ++i) text += open;
    text += inner;
    if (closed) {
        for (size_t i = 0; i < n; ++i) text += close;
    }
    return text;
}

TEST(ConfigJson, DeepNestingIsRefusedWithoutACrash) {
    for (size_t depth : {size_t{100}, size_t{10000}, size_t{1000000}}) {
        const std::vector<std::string> texts = {
            nested(depth, "[", "", "]"),
            nested(depth, "[", "", "]", /*closed=*/false),
            nested(depth, "{\"a\":", "1", "}"),
            "{\"in_channels\": " + nested(depth, "[", "", "]") + "}",
        };
        for (const std::string& text : texts) {
            const Thrown t = thrown_by([&] { parse_config_json(text, "deep.json"); });
            EXPECT_EQ(t.code, ErrorCode::kInvalidArgument) << depth << ": " << t.message;
            EXPECT_TRUE(contains(t.message, "deep.json: JSON nested deeper than 64 levels"))
                << depth << ": " << t.message;
        }
        // And through a config reader, from a file.
        sf::test::TempDir tmp("sf_config_json");
        sf::test::write_file(tmp.file("config.json"), nested(depth, "{\"a\":", "1", "}"));
        const Thrown t = thrown_by(
            [&] { sf::model::SanaTransformerConfig::from_json_file(tmp.path().string()); });
        EXPECT_EQ(t.code, ErrorCode::kInvalidArgument) << t.message;
        EXPECT_TRUE(contains(t.message, "nested deeper than 64")) << t.message;
    }
    // 64 levels are allowed: the limit is exactly kMaxConfigJsonDepth.
    EXPECT_NO_THROW(parse_config_json(nested(63, "{\"a\":", "{}", "}"), "x.json"));
    EXPECT_NO_THROW(parse_config_json("{\"a\":" + nested(63, "[", "", "]") + "}", "x.json"));
    EXPECT_THROW(parse_config_json(nested(64, "{\"a\":", "{}", "}"), "x.json"), sf::Error);
}

}  // namespace
