// Memory-mapped safetensors files and sharded checkpoints.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "storage/atomic_file.h"
#include "storage/safetensors_file.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::every_dtype_record;
using testing::pattern_tensor;
using testing::TempDir;

// Plain write without fsync: the loops below write thousands of variants.
void write_plain(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::map<std::string, TensorView> views_of(const Record& r) {
    std::map<std::string, TensorView> out;
    for (const auto& [name, t] : r.tensors) out.emplace(name, view_of(t));
    return out;
}

TEST(StorageSafetensorsFile, RoundTripWithChecksum) {
    TempDir dir;
    Record r = every_dtype_record(5);
    write_safetensors_file(dir.file("m.safetensors"), r);
    SafetensorsFile f = SafetensorsFile::open(dir.file("m.safetensors"), ChecksumPolicy::kRequire);
    EXPECT_TRUE(f.has_checksum());
    EXPECT_EQ(f.names().size(), r.tensors.size());
    for (const auto& [name, t] : r.tensors) {
        EXPECT_EQ(f.info(name).dtype, t.dtype);
        EXPECT_EQ(f.info(name).shape, t.shape);
        EXPECT_EQ(f.view(name), t.bytes);
        EXPECT_EQ(f.read(name), t);
    }
    EXPECT_EQ(f.metadata().at("source"), "images/cat.jpg");
    // The file is plain safetensors: the in-memory decoder reads it too.
    Record back = decode_safetensors(read_file(dir.file("m.safetensors")));
    back.metadata.erase(kSafetensorsChecksumKey);
    EXPECT_EQ(back, r);
    // No temporary file is left beside it.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                            std::filesystem::directory_iterator()),
              1);
}

TEST(StorageSafetensorsFile, MissingTensorAndFileAreNotFound) {
    TempDir dir;
    write_safetensors_file(dir.file("m.safetensors"), every_dtype_record());
    SafetensorsFile f = SafetensorsFile::open(dir.file("m.safetensors"));
    std::string message;
    EXPECT_EQ(error_code_of([&] { f.view("nope"); }, &message), ErrorCode::kNotFound);
    EXPECT_NE(message.find("m.safetensors"), std::string::npos);
    EXPECT_EQ(error_code_of([&] { SafetensorsFile::open(dir.file("absent.safetensors")); }),
              ErrorCode::kNotFound);
}

TEST(StorageSafetensorsFile, FlippedByteAnywhereIsCorruption) {
    TempDir dir;
    std::string path = dir.file("m.safetensors");
    write_safetensors_file(path, every_dtype_record(9));
    const std::string good = read_file(path);
    std::string bad_path = dir.file("bad.safetensors");
    for (size_t i = 0; i < good.size(); ++i) {
        for (unsigned mask : {0x01u, 0x20u, 0xffu}) {
            std::string bad = good;
            bad[i] = static_cast<char>(bad[i] ^ mask);
            write_plain(bad_path, bad);
            std::string message;
            auto code = error_code_of(
                [&] {
                    SafetensorsFile f = SafetensorsFile::open(bad_path, ChecksumPolicy::kRequire);
                    for (const auto& name : f.names()) f.read(name);
                },
                &message);
            ASSERT_EQ(code, ErrorCode::kCorruption) << "byte " << i << " mask " << mask;
            ASSERT_NE(message.find("bad.safetensors"), std::string::npos) << message;
        }
    }
}

TEST(StorageSafetensorsFile, TruncatedFileIsCorruption) {
    TempDir dir;
    write_safetensors_file(dir.file("m.safetensors"), every_dtype_record());
    const std::string good = read_file(dir.file("m.safetensors"));
    for (size_t n = 0; n < good.size(); ++n) {
        write_plain(dir.file("t.safetensors"), good.substr(0, n));
        for (auto policy : {ChecksumPolicy::kVerifyIfPresent, ChecksumPolicy::kSkip}) {
            ASSERT_EQ(
                error_code_of([&] { SafetensorsFile::open(dir.file("t.safetensors"), policy); }),
                ErrorCode::kCorruption)
                << n << " bytes";
        }
    }
}

TEST(StorageSafetensorsFile, HeaderFaultsAreCorruption) {
    TempDir dir;
    auto with_header = [&](uint64_t length, const std::string& header, const std::string& data) {
        std::string bytes(8, '\0');
        std::memcpy(bytes.data(), &length, 8);
        write_file_atomic(dir.file("h.safetensors"), bytes + header + data);
        std::string message;
        auto code =
            error_code_of([&] { SafetensorsFile::open(dir.file("h.safetensors")); }, &message);
        EXPECT_EQ(code, ErrorCode::kCorruption) << header;
        return message;
    };
    EXPECT_NE(with_header(1 << 20, "{}", "").find("runs past the end"), std::string::npos);
    EXPECT_NE(with_header(uint64_t{1} << 40, "{}", "").find("over the limit"), std::string::npos);
    EXPECT_NE(with_header(5, "{\"a\":", "").find("not valid JSON"), std::string::npos);
    std::string offsets = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    EXPECT_NE(with_header(offsets.size(), offsets, std::string(8, '\0')).find("outside"),
              std::string::npos);
    std::string checksum = R"({"__metadata__":{"sanaflow.xxh3_128":"zz"}})";
    EXPECT_NE(with_header(checksum.size(), checksum, "").find("not 32 hex"), std::string::npos);
}

TEST(StorageSafetensorsFile, FileWithoutChecksumOpensUnlessRequired) {
    TempDir dir;
    Record r = every_dtype_record();
    write_safetensors_file(dir.file("plain.safetensors"), r, /*with_checksum=*/false);
    SafetensorsFile f = SafetensorsFile::open(dir.file("plain.safetensors"));
    EXPECT_FALSE(f.has_checksum());
    EXPECT_EQ(f.read("i64"), r.tensors.at("i64"));
    std::string message;
    EXPECT_EQ(
        error_code_of(
            [&] { SafetensorsFile::open(dir.file("plain.safetensors"), ChecksumPolicy::kRequire); },
            &message),
        ErrorCode::kCorruption);
    EXPECT_NE(message.find("sanaflow.xxh3_128"), std::string::npos);
}

TEST(StorageSafetensorsFile, ShardedCheckpointRoundTrip) {
    TempDir dir;
    Record r;
    for (int i = 0; i < 6; ++i) {
        r.tensors["blocks." + std::to_string(i) + ".weight"] =
            pattern_tensor(DType::kBF16, {16, 16}, i);  // 512 bytes each
    }
    std::string index = write_sharded_safetensors(dir.path(), "model", views_of(r), {{"step", "7"}},
                                                  /*max_shard_bytes=*/1100);
    SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(index, ChecksumPolicy::kRequire);
    EXPECT_EQ(ck.shard_count(), 3u);
    EXPECT_EQ(ck.names().size(), 6u);
    for (const auto& [name, t] : r.tensors) EXPECT_EQ(ck.read(name), t);
    EXPECT_EQ(ck.metadata().at("total_size"), "3072");
    EXPECT_EQ(ck.metadata().at("step"), "7");
    // A directory with one index opens that index.
    EXPECT_EQ(SafetensorsCheckpoint::open(dir.path()).shard_count(), 3u);
    EXPECT_EQ(error_code_of([&] { ck.view("missing"); }), ErrorCode::kNotFound);
}

TEST(StorageSafetensorsFile, SingleFileCheckpoint) {
    TempDir dir;
    Record r = every_dtype_record();
    write_safetensors_file(dir.file("diffusion_pytorch_model.safetensors"), r);
    SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir.path());
    EXPECT_EQ(ck.shard_count(), 1u);
    EXPECT_EQ(ck.read("f16"), r.tensors.at("f16"));
}

TEST(StorageSafetensorsFile, IndexNamingMissingFileIsRefused) {
    TempDir dir;
    Record r;
    r.tensors["a"] = pattern_tensor(DType::kF32, {4}, 1);
    r.tensors["b"] = pattern_tensor(DType::kF32, {4}, 2);
    std::string index = write_sharded_safetensors(dir.path(), "m", views_of(r), {}, 16);
    std::filesystem::remove(dir.file("m-00002-of-00002.safetensors"));
    std::string message;
    EXPECT_EQ(error_code_of([&] { SafetensorsCheckpoint::open(index); }, &message),
              ErrorCode::kNotFound);
    EXPECT_NE(message.find("m-00002-of-00002.safetensors"), std::string::npos) << message;
}

TEST(StorageSafetensorsFile, IndexFaultsAreCorruption) {
    TempDir dir;
    Record r;
    r.tensors["a"] = pattern_tensor(DType::kF32, {4}, 1);
    write_safetensors_file(dir.file("s.safetensors"), r);
    auto open_index = [&](const std::string& text) {
        write_file_atomic(dir.file("x.safetensors.index.json"), text);
        std::string message;
        EXPECT_EQ(error_code_of(
                      [&] { SafetensorsCheckpoint::open(dir.file("x.safetensors.index.json")); },
                      &message),
                  ErrorCode::kCorruption)
            << text;
        return message;
    };
    EXPECT_NE(open_index("{").find("not valid JSON"), std::string::npos);
    EXPECT_NE(open_index("{}").find("weight_map"), std::string::npos);
    EXPECT_NE(open_index(R"({"weight_map":{"b":"s.safetensors"}})").find("does not hold it"),
              std::string::npos);
    EXPECT_NE(open_index(R"({"weight_map":{"a":"../s.safetensors"}})").find("beside the index"),
              std::string::npos);
}

}  // namespace
}  // namespace sf::storage
