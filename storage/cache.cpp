#include "storage/cache.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "storage/json_text.h"
#include "storage/xxh3.h"

namespace sf::storage {
namespace {

constexpr const char* kVersionKey = "format_version";
constexpr const char* kCreatedKey = "created";

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

bool is_reserved_db(const std::string& name) {
    return name == kMetaDb || name == kFingerprintsDb || name == kRejectsDb;
}

std::string reject_to_json(const RejectEntry& entry) {
    nlohmann::json j = {{"source", entry.source},
                        {"stage", entry.stage},
                        {"reason", entry.reason},
                        {"time", entry.time}};
    // A reason quoting undecodable bytes must not lose the reject: replace invalid UTF-8.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

RejectEntry reject_from_json(std::string_view text, const std::string& where) {
    const nlohmann::json j = parse_json(text, where + ": reject entry", ErrorCode::kCorruption);
    auto str = [&](const char* field) {
        auto it = j.find(field);
        if (it == j.end() || !it->is_string()) {
            throw Error::Corruption(where + ": reject entry has no string '" + field + "'");
        }
        return it->get<std::string>();
    };
    if (!j.is_object()) throw Error::Corruption(where + ": reject entry is not a JSON object");
    RejectEntry entry{str("source"), str("stage"), str("reason"), 0};
    auto time = j.find("time");
    if (time != j.end() && time->is_number_integer()) entry.time = time->get<int64_t>();
    return entry;
}

Cache Cache::open(const std::string& dir, bool create) {
    CacheOptions options;
    options.create = create;
    return open(dir, options);
}

Cache Cache::open(const std::string& dir, const CacheOptions& options) {
    LMDBOptions lmdb;
    lmdb.create = options.create;
    lmdb.read_only = options.read_only;
    lmdb.initial_map_size = options.initial_map_size;
    Cache cache(LMDBEnv::open(dir, lmdb));
    LMDBEnv& env = *cache.env_;

    // Another program's LMDB environment is not written into: it has databases but no meta db
    // with a format version. (Only the reserved dbs without a version: our own first open,
    // interrupted before the version was written.)
    std::vector<std::string> foreign;
    for (std::string& name : env.db_names()) {
        if (!is_reserved_db(name)) foreign.push_back(std::move(name));
    }
    if (!foreign.empty()) {
        auto meta = env.open_db(kMetaDb, false);
        bool versioned = false;
        if (meta) {
            LMDBTxn txn(cache.env_, LMDBTxn::Mode::kRead);
            versioned = txn.get(*meta, kVersionKey).has_value();
        }
        if (!versioned) {
            throw Error::InvalidArgument(
                dir + " is an LMDB environment of another program (it holds '" +
                text_excerpt(foreign.front()) +
                "' and no sanaflow format version): not a sanaflow cache, and not written into; "
                "give a new or empty --cache_dir");
        }
    }

    if (!env.read_only()) {
        for (const char* name : {kMetaDb, kFingerprintsDb, kRejectsDb}) env.open_db(name, true);
    }
    auto meta = env.open_db(kMetaDb, false);
    if (!meta) throw Error::Corruption(dir + " holds an LMDB env but no sanaflow meta db");
    std::optional<std::string> version;
    {
        LMDBTxn txn(cache.env_, LMDBTxn::Mode::kRead);
        if (auto v = txn.get(*meta, kVersionKey)) version = std::string(*v);
    }
    if (!version) {
        if (env.read_only()) throw Error::Corruption(dir + ": meta db has no format_version");
        env.write([&](LMDBTxn& txn) {
            if (txn.get(*meta, kVersionKey)) return;  // another process got there first
            txn.put(*meta, kVersionKey, std::to_string(kCacheFormatVersion));
            txn.put(*meta, kCreatedKey, std::to_string(now_seconds()));
        });
        version = std::to_string(kCacheFormatVersion);
    }
    if (*version != std::to_string(kCacheFormatVersion)) {
        throw Error::InvalidArgument("cache " + dir + " has format version " + *version +
                                     "; this build reads version " +
                                     std::to_string(kCacheFormatVersion));
    }
    return cache;
}

LMDBDb Cache::db(const std::string& name) {
    if (is_reserved_db(name)) {
        throw Error::InvalidArgument("'" + name + "' is a reserved db name in cache " + dir());
    }
    if (read_only()) {
        auto found = env_->open_db(name, false);
        if (!found) throw Error::NotFound("cache " + dir() + " has no db '" + name + "'");
        return *found;
    }
    return *env_->open_db(name, true);
}

std::optional<LMDBDb> Cache::find_db(const std::string& name) {
    if (is_reserved_db(name)) {
        throw Error::InvalidArgument("'" + name + "' is a reserved db name in cache " + dir());
    }
    return env_->open_db(name, false);
}

std::vector<std::string> Cache::record_dbs() {
    std::vector<std::string> out;
    for (auto& name : env_->db_names()) {
        if (!is_reserved_db(name)) out.push_back(std::move(name));
    }
    return out;
}

LMDBDb Cache::reserved_db(const char* name) {
    auto found = env_->open_db(name, !read_only());
    if (!found) throw Error::Corruption("cache " + dir() + " has no '" + name + "' db");
    return *found;
}

FingerprintStatus Cache::ensure_fingerprint(const std::string& stage, const Fingerprint& wanted,
                                            const std::vector<std::string>& stage_dbs,
                                            bool rebuild) {
    if (read_only()) {
        if (rebuild)
            throw Error::InvalidArgument("cannot rebuild stage '" + stage +
                                         "' in read-only cache " + dir());
        auto stored = fingerprint(stage);
        if (!stored) {
            throw Error::NotFound("cache " + dir() + " has no fingerprint for stage '" + stage +
                                  "'");
        }
        check_fingerprint(*stored, wanted, stage, dir());
        return FingerprintStatus::kMatched;
    }
    LMDBDb fingerprints = reserved_db(kFingerprintsDb);
    LMDBDb rejects = reserved_db(kRejectsDb);
    std::vector<LMDBDb> dbs;
    for (const auto& name : stage_dbs) dbs.push_back(db(name));
    std::string wanted_json = fingerprint_to_json(wanted);
    const std::string where = "cache " + dir() + " fingerprint of stage '" + stage + "'";

    FingerprintStatus status = FingerprintStatus::kCreated;
    env_->write([&](LMDBTxn& txn) {
        auto stored_json = txn.get(fingerprints, stage);
        if (stored_json && !rebuild) {
            check_fingerprint(fingerprint_from_json(*stored_json, where), wanted, stage, dir());
            status = FingerprintStatus::kMatched;
            return;
        }
        if (!stored_json && !rebuild) {
            for (const LMDBDb& d : dbs) {
                if (txn.count(d) > 0) {
                    throw Error::InvalidArgument(
                        "cache " + dir() + ": db '" + d.name() + "' holds records but stage '" +
                        stage +
                        "' has no fingerprint, so nothing says how they were made; run "
                        "with --rebuild to rebuild stage '" +
                        stage + "'");
                }
            }
            txn.put(fingerprints, stage, wanted_json);
            status = FingerprintStatus::kCreated;
            return;
        }
        for (const LMDBDb& d : dbs) txn.clear(d);
        std::vector<std::string> stale;
        {
            LMDBCursor cursor(txn, rejects);
            for (bool ok = cursor.first(); ok; ok = cursor.next()) {
                RejectEntry entry = reject_from_json(cursor.value(), "cache " + dir() + " rejects");
                if (entry.stage == stage) stale.emplace_back(cursor.key());
            }
        }
        for (const auto& key : stale) txn.del(rejects, key);
        txn.put(fingerprints, stage, wanted_json);
        status = FingerprintStatus::kRebuilt;
    });
    return status;
}

std::optional<Fingerprint> Cache::fingerprint(const std::string& stage) {
    auto fingerprints = env_->open_db(kFingerprintsDb, false);
    if (!fingerprints) return std::nullopt;
    LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
    auto json = txn.get(*fingerprints, stage);
    if (!json) return std::nullopt;
    return fingerprint_from_json(*json, "cache " + dir() + " fingerprint of stage '" + stage + "'");
}

std::map<std::string, Fingerprint> Cache::fingerprints() {
    std::map<std::string, Fingerprint> out;
    auto db = env_->open_db(kFingerprintsDb, false);
    if (!db) return out;
    LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
    LMDBCursor cursor(txn, *db);
    for (bool ok = cursor.first(); ok; ok = cursor.next()) {
        std::string stage(cursor.key());
        out[stage] = fingerprint_from_json(
            cursor.value(), "cache " + dir() + " fingerprint of stage '" + stage + "'");
    }
    return out;
}

std::string Cache::reject_key(const std::string& source) const {
    size_t limit = env_->max_key_size();
    if (!source.empty() && source.size() <= limit) return source;
    // Long paths keep a readable prefix; the hash keeps distinct sources distinct.
    std::string hash = xxh3_128_hex(source);
    return source.substr(0, limit - hash.size() - 1) + "#" + hash;
}

std::optional<RejectEntry> Cache::reject(const std::string& source) {
    auto rejects = env_->open_db(kRejectsDb, false);
    if (!rejects) return std::nullopt;
    LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
    auto json = txn.get(*rejects, reject_key(source));
    if (!json) return std::nullopt;
    return reject_from_json(*json, "cache " + dir() + " reject of " + source);
}

std::vector<RejectEntry> Cache::rejects() {
    std::vector<RejectEntry> out;
    auto rejects = env_->open_db(kRejectsDb, false);
    if (!rejects) return out;
    LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
    LMDBCursor cursor(txn, *rejects);
    for (bool ok = cursor.first(); ok; ok = cursor.next()) {
        out.push_back(reject_from_json(cursor.value(), "cache " + dir() + " rejects"));
    }
    return out;
}

size_t Cache::reject_count() {
    auto rejects = env_->open_db(kRejectsDb, false);
    if (!rejects) return 0;
    LMDBTxn txn(env_, LMDBTxn::Mode::kRead);
    return txn.count(*rejects);
}

}  // namespace sf::storage
