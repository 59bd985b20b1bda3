#include "storage/cache_reader.h"

#include "storage/cache_schema.h"

namespace sf::storage {

CacheSnapshot::CacheSnapshot(LMDBTxn txn, std::optional<LMDBDb> db, std::string where,
                             uint64_t max_bytes)
    : txn_(std::move(txn)), db_(std::move(db)), where_(std::move(where)), max_bytes_(max_bytes) {}

std::string CacheSnapshot::key_for_errors(std::string_view key) const {
    return std::string(key) + " (" + where_ + ")";
}

bool CacheSnapshot::contains(const std::string& key) const {
    return db_ && txn_.get(*db_, key).has_value();
}

std::optional<std::string_view> CacheSnapshot::get_raw(const std::string& key) const {
    if (!db_) return std::nullopt;
    return txn_.get(*db_, key);
}

std::optional<Record> CacheSnapshot::get(const std::string& key) const {
    auto frame = get_raw(key);
    if (!frame) return std::nullopt;
    return decode_record(*frame, key_for_errors(key), max_bytes_);
}

size_t CacheSnapshot::count() const { return db_ ? txn_.count(*db_) : 0; }

void CacheSnapshot::for_each(const RecordVisitor& visit) const {
    if (!db_) return;
    LMDBCursor cursor(txn_, *db_);
    for (bool ok = cursor.first(); ok; ok = cursor.next()) visit(cursor.key(), cursor.value());
}

CacheReader::CacheReader(Cache cache, const std::string& db)
    : cache_(std::move(cache)), db_name_(db) {
    if (is_reserved_db(db)) {
        throw Error::InvalidArgument("'" + db + "' is a reserved db, not a record db, in cache " +
                                     cache_.dir());
    }
}

CacheSnapshot CacheReader::snapshot() const {
    // The handle is looked up on every snapshot until the db exists, so a reader started before
    // the writer's first commit starts seeing records once there are some.
    std::optional<LMDBDb> db = cache_.find_db(db_name_);
    LMDBTxn txn(cache_.env(), LMDBTxn::Mode::kRead);
    return CacheSnapshot(std::move(txn), std::move(db),
                         "db '" + db_name_ + "' in cache " + cache_.dir(),
                         schema::max_record_bytes(db_name_));
}

bool CacheReader::contains(const std::string& key) const { return snapshot().contains(key); }

std::optional<Record> CacheReader::get(const std::string& key) const { return snapshot().get(key); }

std::optional<std::string> CacheReader::get_raw(const std::string& key) const {
    CacheSnapshot snap = snapshot();
    auto frame = snap.get_raw(key);
    if (!frame) return std::nullopt;
    return std::string(*frame);
}

size_t CacheReader::count() const { return snapshot().count(); }

std::vector<std::string> CacheReader::keys() const {
    std::vector<std::string> out;
    snapshot().for_each([&](std::string_view key, std::string_view) { out.emplace_back(key); });
    return out;
}

void CacheReader::for_each(const RecordVisitor& visit) const { snapshot().for_each(visit); }

}  // namespace sf::storage
