// Cache::verify_all and Cache::stats: whole-cache passes for `sanaflow inspect`.
#include <optional>

#include "core/error.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/content_key.h"
#include "storage/tensor_record.h"

namespace sf::storage {
namespace {

// verify_all keeps every corrupt key but only this many error messages per db.
constexpr size_t kMaxErrorsPerDb = 100;

void add_fault(DbVerifyReport& report, const std::string& key, const std::string& error) {
    ++report.corrupt;
    report.corrupt_keys.push_back(key);
    if (report.errors.size() < kMaxErrorsPerDb) report.errors.push_back(error);
}

// What LMDB cannot see: a flipped byte in a B-tree page can change a key, which leaves every
// record valid but one of them unreachable under its name. Checked here: every sample the
// manifest lists exists with its latent and text records, and every text record's key is the
// content key of its own caption and fingerprint.
DbVerifyReport verify_references(Cache& cache) {
    DbVerifyReport report;
    report.db = kReferencesCheck;
    const std::string where = "cache " + cache.dir();
    const CacheSnapshot samples = CacheReader(cache, schema::kSamplesDb).snapshot();
    const CacheSnapshot latents = CacheReader(cache, schema::kLatentsDb).snapshot();
    const CacheSnapshot texts = CacheReader(cache, schema::kTextDb).snapshot();
    std::vector<std::string> keys;
    try {
        if (auto manifest =
                CacheReader(cache, schema::kManifestDb).get(schema::kManifestSamplesKey)) {
            keys = schema::manifest_keys(*manifest, where + " manifest");
        }
    } catch (const Error& e) {
        add_fault(report, schema::kManifestSamplesKey, e.message());
    }
    // Only the manifest's samples: prep lists a sample once its records are all written, and a
    // prep cut off by a kill leaves samples whose latents are still to come.
    for (const std::string& key : keys) {
        std::optional<Record> record;
        try {
            record = samples.get(key);
        } catch (const Error&) {
            continue;  // reported by the per-db pass
        }
        if (!record) {
            add_fault(report, key, where + ": sample " + key + " of the manifest is missing");
            continue;
        }
        try {
            const auto sample =
                schema::SampleRecord::from_record(*record, where + " sample " + key);
            if (!latents.contains(sample.latent_key)) {
                add_fault(report, key,
                          where + ": sample " + key + ": its latent " + sample.latent_key +
                              " is missing");
            } else if (!texts.contains(sample.text_key)) {
                add_fault(
                    report, key,
                    where + ": sample " + key + ": its text " + sample.text_key + " is missing");
            } else {
                ++report.ok;
            }
        } catch (const Error& e) {
            add_fault(report, key, e.message());
        }
    }
    texts.for_each([&](std::string_view key_view, std::string_view) {
        const std::string key(key_view);
        if (key == schema::kEmptyPromptKey) return;
        try {
            const auto record = texts.get(key);
            const auto source = record->metadata.find(schema::kSource);
            const auto fingerprint = record->metadata.find(schema::kFingerprint);
            if (source == record->metadata.end() || fingerprint == record->metadata.end()) return;
            // A --validation_prompt's record is keyed by the prompt alone.
            const bool validation = key.rfind(schema::kValidationPromptPrefix, 0) == 0;
            const std::string want =
                validation ? schema::validation_prompt_key(source->second)
                           : content_key_of(source->second, {{"text", fingerprint->second}});
            if (want != key) {
                add_fault(report, key,
                          where + ": text record " + key +
                              " is stored under the wrong key (its "
                              "caption and fingerprint make " +
                              want + ")");
            } else {
                ++report.ok;
            }
        } catch (const Error&) {
        }
    });
    return report;
}

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
    report.dbs.push_back(verify_references(*this));

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
