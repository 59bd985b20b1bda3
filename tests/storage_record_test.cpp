// The record codec: safetensors bytes in one checksummed zstd frame.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "storage/safetensors_format.h"
#include "storage/tensor_record.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::every_dtype_record;
using testing::make_tensor;
using testing::pattern_tensor;

// A safetensors buffer from a raw header text and data, for hand-made malformed inputs.
std::string raw_safetensors(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
}

TEST(StorageRecord, DTypeNamesAreTheSafetensorsOnes) {
    const std::pair<DType, const char*> expected[] = {
        {DType::kF32, "F32"}, {DType::kBF16, "BF16"}, {DType::kF16, "F16"},  {DType::kI64, "I64"},
        {DType::kI32, "I32"}, {DType::kU8, "U8"},     {DType::kBool, "BOOL"}};
    for (const auto& [dtype, name] : expected) {
        EXPECT_STREQ(dtype_name(dtype), name);
        EXPECT_EQ(dtype_from_name(name), dtype);
    }
    EXPECT_EQ(dtype_size(DType::kBF16), 2u);
    EXPECT_EQ(dtype_size(DType::kI64), 8u);
    EXPECT_FALSE(dtype_from_name("f32").has_value());
}

TEST(StorageRecord, SafetensorsRoundTripEveryDType) {
    Record r = every_dtype_record();
    std::string bytes = encode_safetensors(r);
    Record back = decode_safetensors(bytes);
    EXPECT_EQ(back, r);
    EXPECT_TRUE(back.tensors.at("scalar").shape.empty());
    EXPECT_EQ(back.tensors.at("scalar").bytes.size(), 4u);
    EXPECT_EQ(back.tensors.at("empty").shape, (std::vector<int64_t>{0, 4}));
    EXPECT_TRUE(back.tensors.at("empty").bytes.empty());
}

TEST(StorageRecord, SafetensorsLayoutIsStandard) {
    Record r;
    r.tensors["a"] = make_tensor<float>(DType::kF32, {2}, {1.0f, 2.0f});
    r.tensors["b"] = make_tensor<uint8_t>(DType::kU8, {3}, {1, 2, 3});
    r.metadata["k"] = "v";
    std::string bytes = encode_safetensors(r);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-aligned";
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_EQ(header["a"]["dtype"], "F32");
    EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 8}));
    EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({8, 11}));
    EXPECT_EQ(header["__metadata__"]["k"], "v");
    EXPECT_EQ(bytes.size(), 8 + n + 11);
    float first = 0;
    std::memcpy(&first, bytes.data() + 8 + n, 4);
    EXPECT_EQ(first, 1.0f);
}

TEST(StorageRecord, EncodeRejectsMismatchedBytes) {
    Record r;
    r.tensors["x"] = make_tensor<float>(DType::kF32, {3}, {1.0f, 2.0f});
    std::string message;
    EXPECT_EQ(error_code_of([&] { encode_safetensors(r); }, &message), ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("'x'"), std::string::npos) << message;
}

TEST(StorageRecord, RecordRoundTripEveryDType) {
    Record r = every_dtype_record(7);
    std::string frame = encode_record(r);
    EXPECT_EQ(decode_record(frame, "k"), r);
    EXPECT_EQ(record_content_size(frame, "k"), encode_safetensors(r).size());
    EXPECT_EQ(decompress_record(frame, "k"), encode_safetensors(r));
}

TEST(StorageRecord, EmptyRecordRoundTrips) {
    Record r;
    EXPECT_EQ(decode_record(encode_record(r), "k"), r);
}

TEST(StorageRecord, LargeRecordCompresses) {
    Record r;
    r.tensors["latent"] = pattern_tensor(DType::kBF16, {32, 64, 64}, 3);
    std::string frame = encode_record(r);
    EXPECT_LT(frame.size(), encode_safetensors(r).size());
    EXPECT_EQ(decode_record(frame, "k"), r);
}

// What decoding a damaged record may do: throw kCorruption naming the key, or, when the change
// hit a bit the zstd decoder ignores (the frame descriptor's unused bit, the reserved bits of a
// sequences header), return the original record byte for byte, its content checksum intact.
// Anything else (another error, a crash, a different record) fails the test.
enum class Outcome { kCaught, kHarmless };

Outcome decode_damaged(const std::string& frame, const Record& original, const std::string& where) {
    try {
        Record r = decode_record(frame, "key123");
        EXPECT_EQ(r, original) << where << ": a damaged record decoded to different tensors";
        return Outcome::kHarmless;
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kCorruption) << where << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("key123"), std::string::npos) << e.what();
    }
    return Outcome::kCaught;
}

TEST(StorageRecord, FlippedByteAnywhereIsCorruptionNeverAWrongTensor) {
    const Record original = every_dtype_record(11);
    const std::string frame = encode_record(original);
    int flips = 0, harmless = 0;
    for (size_t i = 0; i < frame.size(); ++i) {
        for (unsigned mask : {0x01u, 0x02u, 0x10u, 0x80u, 0xffu}) {
            std::string bad = frame;
            bad[i] = static_cast<char>(bad[i] ^ mask);
            std::string where = "byte " + std::to_string(i) + " mask " + std::to_string(mask);
            ++flips;
            if (decode_damaged(bad, original, where) == Outcome::kHarmless) ++harmless;
            if (::testing::Test::HasFailure()) return;
        }
    }
    EXPECT_LT(harmless * 100, flips) << harmless << " of " << flips << " flips were ignored bits";
}

TEST(StorageRecord, FlippedByteInLargeRecordIsCorruptionNeverAWrongTensor) {
    Record original;
    original.tensors["latent"] = pattern_tensor(DType::kF32, {8, 128, 128}, 5);  // 512 KiB
    const std::string frame = encode_record(original);
    std::mt19937 rng(42);
    std::vector<size_t> positions;
    for (size_t i = 0; i < 64; ++i) positions.push_back(i);
    for (size_t i = frame.size() - 64; i < frame.size(); ++i) positions.push_back(i);
    for (int k = 0; k < 300; ++k) positions.push_back(rng() % frame.size());
    int harmless = 0;
    for (size_t i : positions) {
        std::string bad = frame;
        bad[i] = static_cast<char>(bad[i] ^ (1 + rng() % 255));
        if (decode_damaged(bad, original, "byte " + std::to_string(i)) == Outcome::kHarmless) {
            ++harmless;
        }
        if (::testing::Test::HasFailure()) return;
    }
    EXPECT_LT(harmless * 100, static_cast<int>(positions.size()) * 2);
}

TEST(StorageRecord, TruncatedOrExtendedFrameIsCorruption) {
    std::string frame = encode_record(every_dtype_record(3));
    for (size_t n = 0; n < frame.size(); ++n) {
        ASSERT_EQ(error_code_of([&] { decode_record(frame.substr(0, n), "k"); }),
                  ErrorCode::kCorruption)
            << "prefix of " << n << " bytes";
    }
    std::string message;
    EXPECT_EQ(error_code_of([&] { decode_record(frame + "x", "k"); }, &message),
              ErrorCode::kCorruption);
    EXPECT_NE(message.find("follow the end"), std::string::npos) << message;
}

TEST(StorageRecord, FrameWithoutChecksumIsRefused) {
    // A plain zstd frame of valid safetensors, but with no content checksum: not a record.
    std::string frame = encode_record(every_dtype_record());
    frame[4] = static_cast<char>(frame[4] & ~0x04);  // Content_Checksum_flag of the descriptor
    std::string message;
    EXPECT_EQ(error_code_of([&] { decode_record(frame, "k"); }, &message), ErrorCode::kCorruption);
    EXPECT_NE(message.find("checksum"), std::string::npos) << message;
}

// Hand-made safetensors buffers that break one rule each.
TEST(StorageRecord, MalformedSafetensorsIsCorruptionNamingTheFault) {
    const std::string data8(8, '\0');
    struct Case {
        std::string buffer;
        std::string expect;  // a word the message must contain
    };
    std::string huge_length(8, '\0');
    uint64_t big = 1000;
    std::memcpy(huge_length.data(), &big, 8);
    const Case cases[] = {
        {"abc", "shorter than"},
        {huge_length + "{}", "runs past the end"},
        {raw_safetensors("not json", ""), "start with '{'"},
        {raw_safetensors("{\"a\":", ""), "not valid JSON"},
        {raw_safetensors("{\"a\":[]}", ""), "not a JSON object"},
        {raw_safetensors(R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", data8),
         "unknown or unsupported dtype"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
         "non-negative integer"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", data8),
         "non-negative integer"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[2]}})", data8), "data_offsets"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data8),
         "outside"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8),
         "outside"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
         "needs 12"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         data8),
         "overlaps"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
         "belong to no tensor"},
        {raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data8),
         "data section has 8"},
        {raw_safetensors(R"({"a":{"dtype":"U8","shape":[4611686018427387904,4],)"
                         R"("data_offsets":[0,8]}})",
                         data8),
         "too large"},
        {raw_safetensors(R"({"__metadata__":{"k":1}})", ""), "not a string"},
        {raw_safetensors(R"({"a":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})",
                         std::string(7, '\1') + "\2"),
         "bool tensor 'a'"},
    };
    for (const Case& c : cases) {
        std::string message;
        auto code = error_code_of([&] { decode_safetensors(c.buffer, "buf.st"); }, &message);
        EXPECT_EQ(code, ErrorCode::kCorruption) << c.expect;
        EXPECT_NE(message.find(c.expect), std::string::npos) << message;
        EXPECT_NE(message.find("buf.st"), std::string::npos) << message;
    }
}

TEST(StorageRecord, HeaderPaddingAndEmptyTensorsAreAccepted) {
    // Other writers pad the header with spaces and may place empty tensors anywhere.
    std::string header = R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                         R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}    )";
    std::string data(4, '\x07');
    Record r = decode_safetensors(raw_safetensors(header, data));
    EXPECT_EQ(r.tensors.at("a").bytes, data);
    EXPECT_TRUE(r.tensors.at("e").bytes.empty());
}

}  // namespace
}  // namespace sf::storage
