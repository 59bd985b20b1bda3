// Writes records into one record db of a cache, committing in batches: a batch is one LMDB
// transaction, so after a crash (kill -9 included) each batch is either wholly there or wholly
// absent, and the rerun redoes only what is missing.
//
// Puts are buffered in memory (at most batch_size of them, and for at most max_commit_interval:
// a slow stage never holds more than a few seconds of work uncommitted) and written in one short
// write transaction, which is run again on a larger map if the map fills; callers never see
// MDB_MAP_FULL. Thread-safe: encoding happens outside the lock, so several threads may share one
// writer.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "storage/cache.h"
#include "storage/tensor_record.h"

namespace sf::storage {

// How long a put may wait for its batch to fill before it is committed anyway.
constexpr std::chrono::milliseconds kDefaultCommitInterval{2000};

class CacheWriter {
public:
    CacheWriter(Cache cache, const std::string& db, size_t batch_size = 64,
                std::chrono::milliseconds max_commit_interval = kDefaultCommitInterval);
    // Commits what is pending. Never throws: a failure is logged with the number of records lost.
    ~CacheWriter();
    CacheWriter(const CacheWriter&) = delete;
    CacheWriter& operator=(const CacheWriter&) = delete;

    // Last put of a key wins. Commits when batch_size puts and rejects are pending, or when the
    // oldest pending one has waited max_commit_interval.
    void put(const std::string& key, const Record& record, int zstd_level = kDefaultZstdLevel);
    // `frame` must be an encode_record() result (checked by its header only).
    void put_raw(const std::string& key, std::string frame);
    // Records why `source` was rejected by `stage`; committed with the records of its batch.
    void add_reject(const std::string& source, const std::string& stage, const std::string& reason);

    // Commits what is pending; throws on failure (the pending entries are kept).
    void flush();

    size_t batch_size() const { return batch_size_; }
    size_t pending() const;
    // Puts and rejects committed by this writer so far.
    int64_t committed() const;

private:
    struct Entry {
        bool reject = false;
        std::string key;
        std::string value;
    };
    void add(Entry entry);
    void flush_locked();

    Cache cache_;
    LMDBDb db_;
    LMDBDb rejects_;
    size_t batch_size_;
    std::chrono::milliseconds max_commit_interval_;
    std::chrono::steady_clock::time_point oldest_pending_;
    mutable std::mutex mutex_;
    std::vector<Entry> pending_;
    int64_t committed_ = 0;
};

}  // namespace sf::storage
