// Crafted input that once crashed the program or made it allocate what a header claimed: every
// JSON reader of storage given nesting 10^2..10^6 deep, zstd frames that lie about their size,
// records over what their kind can hold, and megabyte names quoted in messages.
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_frameHeaderSize
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <string>

#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/cache_writer.h"
#include "storage/fingerprint.h"
#include "storage/json_text.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_record.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::pattern_tensor;
using testing::TempDir;

constexpr size_t kDepths[] = {100, 10000, 1000000};

std::string nested(size_t depth, const std::string& inner = "") {
    return std::string(depth, '[') + inner + std::string(depth, ']');
}

// `f` throws an sf::Error of `code` whose message contains `text` and is short.
void expect_refused(const std::function<void()>& f, ErrorCode code, const std::string& text) {
    std::string message;
    EXPECT_EQ(error_code_of(f, &message), code) << message;
    EXPECT_NE(message.find(text), std::string::npos) << message.substr(0, 500);
    EXPECT_LT(message.size(), 1000u) << message.substr(0, 500);
}

std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
}

// One zstd frame with a content size and checksum around `plain`.
std::string zstd_frame(const std::string& plain) {
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
    std::string out(ZSTD_compressBound(plain.size()), '\0');
    const size_t n = ZSTD_compress2(cctx.get(), out.data(), out.size(), plain.data(), plain.size());
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

// The blocks and checksum of a real frame of `plain` behind a hand-made header that declares
// `declared` bytes (8-byte content size field, a 128 KiB window, checksum flag set).
std::string lying_frame(const std::string& plain, uint64_t declared) {
    const std::string real = zstd_frame(plain);
    const size_t header = ZSTD_frameHeaderSize(real.data(), real.size());
    EXPECT_FALSE(ZSTD_isError(header));
    std::string out = "\x28\xB5\x2F\xFD";  // the magic number, little-endian
    out += static_cast<char>(0xC4);        // 8-byte content size, not single segment, checksum
    out += static_cast<char>(0x38);        // window: 2^17 bytes
    for (int i = 0; i < 8; ++i) out += static_cast<char>((declared >> (8 * i)) & 0xFF);
    return out + real.substr(header);
}

TEST(StorageHostile, ParseJsonRefusesDeepNestingWithTheCodeAsked) {
    for (size_t depth : kDepths) {
        for (const std::string& text :
             {nested(depth), std::string(depth, '['), "{\"a\":" + nested(depth) + "}"}) {
            expect_refused([&] { parse_json(text, "x.json", ErrorCode::kCorruption); },
                           ErrorCode::kCorruption, "x.json: JSON nested deeper than 64 levels");
        }
    }
    EXPECT_NO_THROW(parse_json(nested(64), "x.json"));
    expect_refused([&] { parse_json(nested(65), "x.json"); }, ErrorCode::kInvalidArgument,
                   "deeper than 64");
    // The parser's message quotes the token it stopped in: cut short.
    expect_refused([&] { parse_json("{\"a\": \"" + std::string(1 << 20, 'x'), "x.json"); },
                   ErrorCode::kInvalidArgument, "x.json: not valid JSON");
}

TEST(StorageHostile, SafetensorsHeadersNestedDeepAreCorruption) {
    TempDir dir;
    for (size_t depth : kDepths) {
        const std::string header =
            "{\"w\":{\"dtype\":\"F32\",\"shape\":" + nested(depth) + ",\"data_offsets\":[0,0]}}";
        const std::string bytes = safetensors_bytes(header);
        expect_refused([&] { decode_safetensors(bytes, "buffer"); }, ErrorCode::kCorruption,
                       "nested deeper");
        const std::string frame = zstd_frame(bytes);
        expect_refused([&] { decode_record(frame, "key-1"); }, ErrorCode::kCorruption,
                       "record key-1: header: JSON nested deeper than 64 levels");
        write_file_atomic(dir.file("m.safetensors"), bytes);
        expect_refused([&] { SafetensorsFile::open(dir.file("m.safetensors")); },
                       ErrorCode::kCorruption, "m.safetensors: header: JSON nested deeper");
        // A shard index whose metadata nests deep.
        write_file_atomic(dir.file("m.safetensors.index.json"),
                          "{\"metadata\":{\"a\":" + nested(depth) + "},\"weight_map\":{}}");
        expect_refused([&] { SafetensorsCheckpoint::open(dir.file("m.safetensors.index.json")); },
                       ErrorCode::kCorruption, "index: JSON nested deeper");
    }
}

TEST(StorageHostile, FingerprintsAndRejectsNestedDeepAreCorruption) {
    for (size_t depth : kDepths) {
        const std::string text = "{\"a\":" + nested(depth) + "}";
        expect_refused([&] { fingerprint_from_json(text, "stage 'x'"); }, ErrorCode::kCorruption,
                       "stage 'x': fingerprint: JSON nested deeper");
        expect_refused([&] { reject_from_json(text, "reject 'y'"); }, ErrorCode::kCorruption,
                       "reject 'y': reject entry: JSON nested deeper");
    }
}

TEST(StorageHostile, HugeValuesAreQuotedShort) {
    const std::string name(1 << 20, 'n');
    const std::string dtype(1 << 20, 'd');
    expect_refused(
        [&] {
            decode_safetensors(safetensors_bytes("{\"" + name + "\":{\"dtype\":\"" + dtype +
                                                     "\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                                                 std::string(4, '\0')));
        },
        ErrorCode::kCorruption, "unknown or unsupported dtype");
    expect_refused(
        [&] {
            decode_safetensors(safetensors_bytes(
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"" + name + "\"],\"data_offsets\":[0,4]}}",
                std::string(4, '\0')));
        },
        ErrorCode::kCorruption, "not a non-negative integer");
    EXPECT_EQ(text_excerpt(std::string(100, 'a'), 10), "aaaaaaaaaa...");
    EXPECT_EQ(text_excerpt("\xC3\xA9\xC3\xA9", 3), "\xC3\xA9...");  // never half a character
}

TEST(StorageHostile, AFrameThatOverstatesItsSizeAllocatesOnlyWhatItProduces) {
    const std::string plain = safetensors_bytes("{}      ");
    ASSERT_NO_THROW(decode_record(zstd_frame(plain), "good"));
    // 4.3 GB declared, as the bomb found by fuzzing: over the limit, refused before allocating.
    expect_refused([&] { decode_record(lying_frame(plain, uint64_t{4300} << 20), "bomb"); },
                   ErrorCode::kCorruption, "record bomb: the frame declares 4508876800 bytes");
    // 2^62 bytes declared and allowed by the caller: allocating it up front would throw
    // std::bad_alloc; growing with the output never gets past the first buffer.
    expect_refused(
        [&] { decode_record(lying_frame(plain, uint64_t{1} << 62), "liar", UINT64_MAX); },
        ErrorCode::kCorruption, "record liar: zstd: ");  // zstd sees the size does not match
    // Fewer bytes declared than the blocks hold.
    expect_refused([&] { decode_record(lying_frame(plain, 4), "short", UINT64_MAX); },
                   ErrorCode::kCorruption, "record short: ");
}

TEST(StorageHostile, RecordsOverTheirKindsLimitAreNeitherWrittenNorRead) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    Record big;  // 2 MiB of zeros: a few KB compressed, over a sample record's 1 MiB
    big.tensors["x"] = pattern_tensor(DType::kU8, {2 << 20}, 0);
    std::memset(big.tensors["x"].bytes.data(), 0, big.tensors["x"].bytes.size());
    {
        CacheWriter writer(cache, schema::kSamplesDb, 1);
        expect_refused([&] { writer.put("k", big); }, ErrorCode::kInvalidArgument,
                       "cannot write into db 'samples': record k: the frame declares");
        Record small;
        small.tensors["x"] = pattern_tensor(DType::kU8, {16}, 1);
        writer.put("k", small);  // a small record still goes in
    }
    CacheWriter(cache, schema::kLatentsDb, 1).put("big", big);  // a latent may be that large
    // Written behind the writer's back, it is corrupt to every reader.
    const std::string frame = encode_record(big);
    LMDBDb db = cache.db(schema::kSamplesDb);
    cache.env()->write([&](LMDBTxn& txn) { txn.put(db, "bomb", frame); });
    CacheReader reader(cache, schema::kSamplesDb);
    expect_refused([&] { reader.get("bomb"); }, ErrorCode::kCorruption,
                   "record bomb (db 'samples' in cache");
    EXPECT_TRUE(reader.get("k").has_value());
    const VerifyReport report = cache.verify_all();
    ASSERT_EQ(report.corrupt, 1);
    for (const DbVerifyReport& d : report.dbs) {
        if (d.db == schema::kSamplesDb) {
            EXPECT_EQ(d.corrupt_keys, std::vector<std::string>{"bomb"});
        }
    }
}

TEST(StorageHostile, AnotherProgramsLmdbIsNotWrittenInto) {
    TempDir dir;
    {
        auto env = LMDBEnv::open(dir.path().string(), LMDBOptions{});
        LMDBDb db = *env->open_db("accounts", true);
        env->write([&](LMDBTxn& txn) { txn.put(db, "alice", "42"); });
    }
    expect_refused([&] { Cache::open(dir.path().string()); }, ErrorCode::kInvalidArgument,
                   "is an LMDB environment of another program (it holds 'accounts'");
    auto env = LMDBEnv::open(dir.path().string(), LMDBOptions{});
    EXPECT_EQ(env->db_names(), std::vector<std::string>{"accounts"});  // nothing added
    // Our own first open, cut off before the version was written, is finished by the next.
    TempDir ours;
    {
        auto partial = LMDBEnv::open(ours.path().string(), LMDBOptions{});
        partial->open_db(kMetaDb, true);
        partial->open_db(kRejectsDb, true);
    }
    EXPECT_NO_THROW(Cache::open(ours.path().string()));
}

TEST(StorageHostile, AHeaderTheReaderWouldRefuseIsNeverWritten) {
    Record r;
    r.metadata["caption"] = std::string(kMaxSafetensorsHeader + 1, 'c');
    expect_refused([&] { encode_record(r); }, ErrorCode::kInvalidArgument, "safetensors header of");
}

}  // namespace
}  // namespace sf::storage
