#include "storage/cache_writer.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "storage/cache_schema.h"

namespace sf::storage {

CacheWriter::CacheWriter(Cache cache, const std::string& db, size_t batch_size,
                         std::chrono::milliseconds max_commit_interval)
    : cache_(std::move(cache)),
      db_(cache_.db(db)),
      rejects_(*cache_.env()->open_db(kRejectsDb, true)),
      batch_size_(batch_size == 0 ? 1 : batch_size),
      max_commit_interval_(max_commit_interval) {
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
    put_raw(key, std::move(frame));
}

void CacheWriter::put_raw(const std::string& key, std::string frame) {
    // The checks a reader makes of the frame's header: a record the reader would refuse as
    // corrupt is never written (a rerun would count it as cached and never repair it).
    try {
        record_content_size(frame, key, schema::max_record_bytes(db_.name()));
    } catch (const Error& e) {
        throw Error::InvalidArgument("cannot write into db '" + db_.name() + "': " + e.message());
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
    const auto now = std::chrono::steady_clock::now();
    if (pending_.empty()) oldest_pending_ = now;
    pending_.push_back(std::move(entry));
    if (pending_.size() >= batch_size_ || now - oldest_pending_ >= max_commit_interval_)
        flush_locked();
}

void CacheWriter::flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_locked();
}

void CacheWriter::flush_locked() {
    if (pending_.empty()) return;
    try {
        cache_.env()->write([&](LMDBTxn& txn) {
            for (const Entry& e : pending_) txn.put(e.reject ? rejects_ : db_, e.key, e.value);
        });
    } catch (const Error& e) {
        if (e.code() != ErrorCode::kIOError || e.message().rfind("disk full", 0) != 0) throw;
        uint64_t bytes = 0;
        for (const Entry& entry : pending_) bytes += entry.key.size() + entry.value.size();
        throw Error::IOError(fmt::format("{}; the batch of {} records ({}) is kept pending",
                                         e.message(), pending_.size(),
                                         format_bytes(static_cast<int64_t>(bytes))));
    }
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
