// The cache: fingerprints, batched writer, reader, rejects, verification.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/cache_writer.h"
#include "storage/content_key.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::pattern_tensor;
using testing::TempDir;

std::string key_of(int i) {
    return content_key_of("sample-" + std::to_string(i), {{"size", "64"}});
}

Record record_of(int i) {
    Record r;
    r.tensors["latent"] = pattern_tensor(DType::kBF16, {4, 16, 16}, static_cast<uint32_t>(i));
    r.metadata[schema::kSource] = "sample-" + std::to_string(i);
    return r;
}

const Fingerprint kVae = {{"stage", "encode_vae"}, {"resolution", "1024"}, {"dtype", "bf16"}};

TEST(StorageCache, OpenWritesFormatVersionAndReopens) {
    TempDir dir;
    { Cache::open(dir.path()); }
    Cache cache = Cache::open(dir.path(), /*create=*/false);
    EXPECT_TRUE(cache.record_dbs().empty());
    EXPECT_TRUE(std::filesystem::exists(dir.file("data.mdb")));
    EXPECT_EQ(error_code_of([&] { Cache::open(dir.file("absent"), false); }), ErrorCode::kNotFound);
    EXPECT_EQ(error_code_of([&] { cache.db("meta"); }), ErrorCode::kInvalidArgument);
}

TEST(StorageCache, FingerprintCreatedMatchedAndMismatchNamesTheField) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    EXPECT_EQ(cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, false),
              FingerprintStatus::kCreated);
    EXPECT_EQ(cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, false),
              FingerprintStatus::kMatched);
    EXPECT_EQ(cache.fingerprint("encode_vae"), kVae);

    Fingerprint other = kVae;
    other["resolution"] = "2048";
    other["vae"] = "abc";
    std::string message;
    EXPECT_EQ(
        error_code_of([&] { cache.ensure_fingerprint("encode_vae", other, {"latents"}, false); },
                      &message),
        ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("resolution: cache has 1024, run wants 2048"), std::string::npos)
        << message;
    EXPECT_NE(message.find("vae: cache has nothing, run wants abc"), std::string::npos) << message;
    EXPECT_EQ(message.find("dtype:"), std::string::npos) << "equal fields are not listed";
    EXPECT_NE(message.find("--rebuild"), std::string::npos) << message;
    EXPECT_NE(message.find("encode_vae"), std::string::npos) << message;
    EXPECT_EQ(cache.fingerprint("encode_vae"), kVae) << "a refused run changes nothing";
}

TEST(StorageCache, RebuildDropsTheStageRecordsAndRejects) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, false);
    cache.ensure_fingerprint("encode_text", {{"stage", "encode_text"}}, {"text"}, false);
    {
        CacheWriter vae(cache, "latents", 8);
        for (int i = 0; i < 5; ++i) vae.put(key_of(i), record_of(i));
        vae.add_reject("bad.jpg", "encode_vae", "truncated JPEG");
        CacheWriter text(cache, "text", 8);
        text.put(key_of(100), record_of(100));
        text.add_reject("bad.txt", "encode_text", "empty caption");
    }
    Fingerprint other = kVae;
    other["resolution"] = "512";
    EXPECT_EQ(cache.ensure_fingerprint("encode_vae", other, {"latents"}, true),
              FingerprintStatus::kRebuilt);
    EXPECT_EQ(cache.fingerprint("encode_vae"), other);
    EXPECT_EQ(CacheReader(cache, "latents").count(), 0u);
    EXPECT_EQ(CacheReader(cache, "text").count(), 1u) << "other stages are untouched";
    EXPECT_FALSE(cache.reject("bad.jpg").has_value());
    EXPECT_TRUE(cache.reject("bad.txt").has_value());
}

TEST(StorageCache, RecordsWithoutFingerprintAreRefused) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    { CacheWriter(cache, "latents", 4).put(key_of(1), record_of(1)); }
    std::string message;
    EXPECT_EQ(
        error_code_of([&] { cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, false); },
                      &message),
        ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("no fingerprint"), std::string::npos) << message;
    EXPECT_EQ(cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, true),
              FingerprintStatus::kRebuilt);
}

TEST(StorageCache, WriterCommitsInBatchesAndOnFlush) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    CacheReader reader(cache, "samples");
    EXPECT_EQ(reader.count(), 0u) << "a db not yet created reads as empty";
    {
        CacheWriter writer(cache, "samples", 4);
        for (int i = 0; i < 10; ++i) writer.put(key_of(i), record_of(i));
        EXPECT_EQ(reader.count(), 8u);
        EXPECT_EQ(writer.pending(), 2u);
        writer.flush();
        EXPECT_EQ(reader.count(), 10u);
        writer.put(key_of(10), record_of(10));
        EXPECT_EQ(writer.committed(), 10);
    }  // the destructor commits the last one
    EXPECT_EQ(reader.count(), 11u);
    for (int i = 0; i <= 10; ++i) {
        ASSERT_TRUE(reader.contains(key_of(i)));
        EXPECT_EQ(reader.get(key_of(i)), record_of(i));
    }
    EXPECT_FALSE(reader.get("0123").has_value());
    auto keys = reader.keys();
    EXPECT_EQ(keys.size(), 11u);
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
}

TEST(StorageCache, PutRawTakesOnlyRecordFrames) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    CacheWriter writer(cache, "samples", 4);
    writer.put_raw(key_of(1), encode_record(record_of(1)));
    EXPECT_EQ(error_code_of([&] { writer.put_raw(key_of(2), "not a frame"); }),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(error_code_of([&] { writer.put(std::string(600, 'k'), record_of(1)); }),
              ErrorCode::kInvalidArgument);
    writer.flush();
    EXPECT_EQ(CacheReader(cache, "samples").get(key_of(1)), record_of(1));
}

TEST(StorageCache, RejectListKeepsSourceStageAndReason) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    std::string long_source = "/data/" + std::string(1000, 'p') + ".jpg";
    {
        CacheWriter writer(cache, "samples", 100);
        writer.add_reject("a.jpg", "decode_image", "image too small: 32x32");
        writer.add_reject(long_source, "decode_image", "not an image");
    }
    auto a = cache.reject("a.jpg");
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->stage, "decode_image");
    EXPECT_EQ(a->reason, "image too small: 32x32");
    EXPECT_GT(a->time, 0);
    auto b = cache.reject(long_source);
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->source, long_source);
    EXPECT_EQ(cache.reject_count(), 2u);
    EXPECT_EQ(cache.rejects().size(), 2u);
    EXPECT_FALSE(cache.reject("b.jpg").has_value());
}

TEST(StorageCache, CorruptRecordIsReportedByKeyAndByVerifyAll) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    cache.ensure_fingerprint("encode_vae", kVae, {"latents"}, false);
    {
        CacheWriter writer(cache, "latents", 16);
        for (int i = 0; i < 6; ++i) writer.put(key_of(i), record_of(i));
    }
    // Damage one stored record behind the writer's back.
    LMDBDb db = cache.db("latents");
    cache.env()->write([&](LMDBTxn& txn) {
        std::string frame(*txn.get(db, key_of(3)));
        frame[frame.size() / 2] ^= 0x10;
        txn.put(db, key_of(3), frame);
    });
    CacheReader reader(cache, "latents");
    std::string message;
    EXPECT_EQ(error_code_of([&] { reader.get(key_of(3)); }, &message), ErrorCode::kCorruption);
    EXPECT_NE(message.find(key_of(3)), std::string::npos) << message;
    EXPECT_NE(message.find("latents"), std::string::npos) << message;
    EXPECT_EQ(reader.get(key_of(2)), record_of(2));

    int64_t last_progress = -1;
    VerifyReport report = cache.verify_all([&](int64_t n) { last_progress = n; });
    EXPECT_EQ(report.ok, 6);  // 5 records and 1 fingerprint
    EXPECT_EQ(report.corrupt, 1);
    EXPECT_EQ(last_progress, 7);
    ASSERT_EQ(report.dbs[0].db, "latents");
    EXPECT_EQ(report.dbs[0].corrupt_keys, std::vector<std::string>{key_of(3)});
}

TEST(StorageCache, StatsCountEntriesAndBothSizes) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    {
        CacheWriter writer(cache, "latents", 16);
        for (int i = 0; i < 4; ++i) writer.put(key_of(i), record_of(i));
    }
    int64_t expected_plain = 0, expected_stored = 0;
    for (int i = 0; i < 4; ++i) {
        expected_plain += static_cast<int64_t>(encode_safetensors(record_of(i)).size());
        expected_stored += static_cast<int64_t>(encode_record(record_of(i)).size());
    }
    bool found = false;
    for (const DbStats& s : cache.stats()) {
        if (s.db != "latents") continue;
        found = true;
        EXPECT_EQ(s.entries, 4);
        EXPECT_EQ(s.uncompressed_bytes, expected_plain);
        EXPECT_EQ(s.stored_bytes, expected_stored);
        EXPECT_LT(s.stored_bytes, s.uncompressed_bytes);
    }
    EXPECT_TRUE(found);
}

TEST(StorageCache, WriterGrowsATinyMap) {
    TempDir dir;
    CacheOptions options;
    options.initial_map_size = 64 << 10;
    Cache cache = Cache::open(dir.path(), options);
    {
        CacheWriter writer(cache, "latents", 25);
        for (int i = 0; i < 300; ++i) writer.put(key_of(i), record_of(i));
    }
    CacheReader reader(cache, "latents");
    EXPECT_EQ(reader.count(), 300u);
    EXPECT_GT(cache.env()->map_size(), size_t{64} << 10);
    for (int i = 0; i < 300; i += 7) EXPECT_EQ(reader.get(key_of(i)), record_of(i));
    EXPECT_EQ(cache.verify_all().corrupt, 0);
}

// While a writer commits batches, a reader's snapshot always holds whole batches, each record
// intact; the map also grows meanwhile.
TEST(StorageCache, ReaderSeesWholeBatchesWhileWriterCommits) {
    TempDir dir;
    CacheOptions options;
    options.initial_map_size = 64 << 10;
    Cache cache = Cache::open(dir.path(), options);
    constexpr int kRecords = 400;
    constexpr size_t kBatch = 10;
    std::map<std::string, int> index_of;
    for (int i = 0; i < kRecords; ++i) index_of[key_of(i)] = i;

    std::atomic<bool> done{false};
    std::string writer_error;
    std::thread writer_thread([&] {
        try {
            CacheWriter writer(cache, "latents", kBatch);
            for (int i = 0; i < kRecords; ++i) writer.put(key_of(i), record_of(i));
            writer.flush();
        } catch (const std::exception& e) {
            writer_error = e.what();
        }
        done = true;
    });
    CacheReader reader(cache, "latents");
    size_t last = 0;
    int snapshots = 0;
    while (true) {
        bool finished = done.load();
        CacheSnapshot snap = reader.snapshot();
        size_t count = snap.count();
        ASSERT_EQ(count % kBatch, 0u) << "a snapshot holds whole batches only";
        ASSERT_GE(count, last);
        last = count;
        size_t seen = 0;
        snap.for_each([&](std::string_view key, std::string_view frame) {
            ++seen;
            auto it = index_of.find(std::string(key));
            ASSERT_NE(it, index_of.end());
            ASSERT_EQ(decode_record(frame, std::string(key)), record_of(it->second));
        });
        ASSERT_EQ(seen, count);
        ++snapshots;
        if (finished) break;
    }
    writer_thread.join();
    EXPECT_EQ(writer_error, "");
    EXPECT_EQ(last, static_cast<size_t>(kRecords));
    EXPECT_GT(snapshots, 1);
}

}  // namespace
}  // namespace sf::storage
