#include "storage/cache_writer.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace sf::storage {

CacheWriter::CacheWriter(Cache cache, const std::string& db, size_t batch_size)
    : cache_(std::move(cache)),
      db_(cache_.db(db)),
      rejects_(*cache_.env()->open_db(kRejectsDb, true)),
      batch_size_(batch_size == 0 ? 1 : batch_size) {
    pending_.reserve(batch_size_);
}

CacheWriter::~CacheWriter() {
    try {
        flush();
    } catch (const std::exception& e) {
        log_error("cache {}: {} pending entries of db '{}' were not committed: {}", cache_.dir(),
                  pending_.size(), db_.name(), e.what());
    }
}

void CacheWriter::put(const std::string& key, const Record& record, int zstd_level) {
    std::string frame = encode_record(record, zstd_level);  // outside the lock: the costly part
    add(Entry{false, key, std::move(frame)});
}

void CacheWriter::put_raw(const std::string& key, std::string frame) {
    try {
        record_content_size(frame, key);
    } catch (const Error& e) {
        throw Error::InvalidArgument(std::string("put_raw into db '") + db_.name() +
                                     "' was not given a record frame: " + e.what());
    }
    add(Entry{false, key, std::move(frame)});
}

void CacheWriter::add_reject(const std::string& source, const std::string& stage,
                             const std::string& reason) {
    int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    add(Entry{true, cache_.reject_key(source), reject_to_json({source, stage, reason, now})});
}

void CacheWriter::add(Entry entry) {
    // Checked here, not at commit, so one bad key cannot make every later batch fail.
    size_t limit = cache_.env()->max_key_size();
    if (entry.key.empty() || entry.key.size() > limit) {
        throw Error::InvalidArgument("key '" + entry.key.substr(0, 80) + "' for db '" + db_.name() +
                                     "' must be 1 to " + std::to_string(limit) + " bytes");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(std::move(entry));
    if (pending_.size() >= batch_size_) flush_locked();
}

void CacheWriter::flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_locked();
}

void CacheWriter::flush_locked() {
    if (pending_.empty()) return;
    cache_.env()->write([&](LMDBTxn& txn) {
        for (const Entry& e : pending_) txn.put(e.reject ? rejects_ : db_, e.key, e.value);
    });
    committed_ += static_cast<int64_t>(pending_.size());
    pending_.clear();
}

size_t CacheWriter::pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.size();
}

int64_t CacheWriter::committed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return committed_;
}

}  // namespace sf::storage
