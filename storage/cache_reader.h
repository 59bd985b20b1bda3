// Reads records of one record db: random access by key and iteration. Every record read is
// verified (zstd content checksum); a damaged one is a kCorruption error naming db and key.
//
// Each CacheReader call sees one committed state. For several reads that must agree with each
// other, take a CacheSnapshot: it holds one LMDB read transaction, so it sees a single committed
// state however many batches a writer commits meanwhile. Keep snapshots short while a writer may
// need to grow the map: growth waits for the open read transactions of this process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/cache.h"
#include "storage/tensor_record.h"

namespace sf::storage {

using RecordVisitor = std::function<void(std::string_view key, std::string_view frame)>;

// One LMDB read transaction: use it from one thread at a time (it may move between threads).
class CacheSnapshot {
public:
    // Records are refused (kCorruption) when they declare more than their kind can hold
    // (schema::max_record_bytes).
    bool contains(const std::string& key) const;
    std::optional<Record> get(const std::string& key) const;
    // The stored frame, unverified; it lives in the map until the snapshot ends.
    std::optional<std::string_view> get_raw(const std::string& key) const;
    size_t count() const;
    // In key order. `key` and `frame` are valid during the call only.
    void for_each(const RecordVisitor& visit) const;

private:
    friend class CacheReader;
    CacheSnapshot(LMDBTxn txn, std::optional<LMDBDb> db, std::string where, uint64_t max_bytes);
    std::string key_for_errors(std::string_view key) const;

    LMDBTxn txn_;
    std::optional<LMDBDb> db_;  // absent: the db does not exist yet, so it reads as empty
    std::string where_;
    uint64_t max_bytes_;  // schema::max_record_bytes of the db
};

class CacheReader {
public:
    // A db that does not exist (yet) reads as empty.
    CacheReader(Cache cache, const std::string& db);

    bool contains(const std::string& key) const;
    std::optional<Record> get(const std::string& key) const;
    std::optional<std::string> get_raw(const std::string& key) const;
    size_t count() const;
    std::vector<std::string> keys() const;
    // One snapshot for the whole iteration.
    void for_each(const RecordVisitor& visit) const;

    CacheSnapshot snapshot() const;
    const std::string& db_name() const { return db_name_; }

private:
    mutable Cache cache_;
    std::string db_name_;
};

}  // namespace sf::storage
