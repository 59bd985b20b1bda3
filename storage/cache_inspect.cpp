// Cache::verify_all and Cache::stats: whole-cache passes for `sanaflow inspect`.
#include "core/error.h"
#include "storage/cache.h"
#include "storage/cache_schema.h"
#include "storage/tensor_record.h"

namespace sf::storage {
namespace {

// verify_all keeps every corrupt key but only this many error messages per db.
constexpr size_t kMaxErrorsPerDb = 100;

}  // namespace

VerifyReport Cache::verify_all(const std::function<void(int64_t)>& progress) {
    VerifyReport report;
    int64_t checked = 0;
    auto tick = [&]() {
        ++checked;
        if (progress && checked % 1000 == 0) progress(checked);
    };

    for (const std::string& name : record_dbs()) {
        DbVerifyReport db_report;
        db_report.db = name;
        auto db = env_->open_db(name, false);
        if (!db) continue;
        LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
        LMDBCursor cursor(txn, *db);
        for (bool ok = cursor.first(); ok; ok = cursor.next()) {
            std::string key(cursor.key());
            try {
                decode_record(cursor.value(), key + " (db '" + name + "' in cache " + dir() + ")",
                              schema::max_record_bytes(name));
                ++db_report.ok;
            } catch (const Error& e) {
                ++db_report.corrupt;
                db_report.corrupt_keys.push_back(key);
                if (db_report.errors.size() < kMaxErrorsPerDb) db_report.errors.push_back(e.what());
            }
            tick();
        }
        report.dbs.push_back(std::move(db_report));
    }

    DbVerifyReport fingerprints;
    fingerprints.db = kFingerprintsDb;
    if (auto db = env_->open_db(kFingerprintsDb, false)) {
        LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
        LMDBCursor cursor(txn, *db);
        for (bool ok = cursor.first(); ok; ok = cursor.next()) {
            std::string stage(cursor.key());
            try {
                fingerprint_from_json(cursor.value(), "cache " + dir() + " stage '" + stage + "'");
                ++fingerprints.ok;
            } catch (const Error& e) {
                ++fingerprints.corrupt;
                fingerprints.corrupt_keys.push_back(stage);
                fingerprints.errors.push_back(e.what());
            }
            tick();
        }
    }
    report.dbs.push_back(std::move(fingerprints));

    for (const auto& db : report.dbs) {
        report.ok += db.ok;
        report.corrupt += db.corrupt;
    }
    if (progress) progress(checked);
    return report;
}

std::vector<DbStats> Cache::stats() {
    std::vector<DbStats> out;
    for (const std::string& name : env_->db_names()) {
        auto db = env_->open_db(name, false);
        if (!db) continue;
        DbStats s;
        s.db = name;
        bool records = !is_reserved_db(name);
        LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
        LMDBCursor cursor(txn, *db);
        for (bool ok = cursor.first(); ok; ok = cursor.next()) {
            std::string_view value = cursor.value();
            ++s.entries;
            s.stored_bytes += static_cast<int64_t>(value.size());
            int64_t plain = static_cast<int64_t>(value.size());
            if (records) {
                // Only the frame header is read; a damaged one is counted at its stored size and
                // left for verify_all to report.
                try {
                    plain = static_cast<int64_t>(record_content_size(
                        value, std::string(cursor.key()), schema::max_record_bytes(name)));
                } catch (const Error&) {
                }
            }
            s.uncompressed_bytes += plain;
        }
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace sf::storage
