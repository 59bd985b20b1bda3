// A cache is a directory holding one LMDB env (data.mdb, lock.mdb) with these named dbs:
//   meta          format version and creation time
//   fingerprints  stage name -> fingerprint JSON
//   rejects       source -> {"source", "stage", "reason", "time"} JSON
//   <record db>   one per record kind: content key -> record (the names: cache_schema.h)
// A record is a safetensors buffer in one zstd frame with its checksum (tensor_record.h).
// docs/cache-format.md describes the format for readers in other languages.
//
// Writing goes through CacheWriter (cache_writer.h), reading through CacheReader
// (cache_reader.h). Both may be used from several threads and processes at once: LMDB readers
// see the last committed state and never wait for the writer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/fingerprint.h"
#include "storage/lmdb.h"

namespace sf::storage {

// Version 1: the layout above. Frozen: a change readers of version 1 cannot read bumps it.
constexpr int kCacheFormatVersion = 1;

constexpr const char* kMetaDb = "meta";
constexpr const char* kFingerprintsDb = "fingerprints";
constexpr const char* kRejectsDb = "rejects";

struct CacheOptions {
    bool create = true;  // make the directory and env when missing
    bool read_only = false;
    size_t initial_map_size = size_t{1} << 30;  // grows on demand
};

enum class FingerprintStatus { kCreated, kMatched, kRebuilt };

struct RejectEntry {
    std::string source;
    std::string stage;
    std::string reason;
    int64_t time = 0;  // seconds since the epoch
};

struct DbStats {
    std::string db;
    int64_t entries = 0;
    int64_t stored_bytes = 0;        // values as stored (compressed records)
    int64_t uncompressed_bytes = 0;  // content sizes the record frames declare
};

struct DbVerifyReport {
    std::string db;
    int64_t ok = 0;
    int64_t corrupt = 0;
    std::vector<std::string> corrupt_keys;
    std::vector<std::string> errors;  // one message per corrupt key, same order
};

// The name verify_all's report gives the cross-record checks (manifest -> samples -> latents and
// text, text keys recomputed), reported like a db.
constexpr const char* kReferencesCheck = "(references)";

struct VerifyReport {
    std::vector<DbVerifyReport> dbs;  // record dbs, the fingerprint db, then kReferencesCheck
    int64_t ok = 0;
    int64_t corrupt = 0;
};

class Cache {
public:
    // Opens (creating when `create`) the cache in `dir`. kNotFound when it does not exist and
    // may not be created; kInvalidArgument for another format version.
    static Cache open(const std::string& dir, bool create = true);
    static Cache open(const std::string& dir, const CacheOptions& options);

    const std::string& dir() const { return env_->dir(); }
    bool read_only() const { return env_->read_only(); }
    const std::shared_ptr<LMDBEnv>& env() const { return env_; }

    // A record db, created when absent; kInvalidArgument for the reserved names.
    LMDBDb db(const std::string& name);
    // A record db if it exists.
    std::optional<LMDBDb> find_db(const std::string& name);
    // Every named db that is not one of the reserved ones.
    std::vector<std::string> record_dbs();

    // Makes sure `stage`'s cached output was made under `wanted`:
    // - no stored fingerprint: stores `wanted` (kCreated);
    // - the same one: kMatched;
    // - a different one: kInvalidArgument naming each differing field, unless `rebuild`.
    // With `rebuild`, `stage_dbs` are emptied, the stage's rejects forgotten and `wanted` stored,
    // all in one transaction (kRebuilt). Records present without any fingerprint are refused the
    // same way, since nothing says how they were made.
    FingerprintStatus ensure_fingerprint(const std::string& stage, const Fingerprint& wanted,
                                         const std::vector<std::string>& stage_dbs, bool rebuild);
    std::optional<Fingerprint> fingerprint(const std::string& stage);
    // Every stored fingerprint, by stage name.
    std::map<std::string, Fingerprint> fingerprints();

    std::optional<RejectEntry> reject(const std::string& source);
    std::vector<RejectEntry> rejects();
    size_t reject_count();
    // The rejects db key for `source`: the source itself, or for a source longer than LMDB's key
    // limit, a prefix plus a hash of the whole.
    std::string reject_key(const std::string& source) const;

    // Decodes every record of every record db (checksums verified) and parses every fingerprint.
    // `progress`, when given, is called with the number of entries checked so far.
    VerifyReport verify_all(const std::function<void(int64_t)>& progress = {});
    // Entries and bytes per db, reserved dbs included.
    std::vector<DbStats> stats();

private:
    explicit Cache(std::shared_ptr<LMDBEnv> env) : env_(std::move(env)) {}
    LMDBDb reserved_db(const char* name);

    std::shared_ptr<LMDBEnv> env_;
};

bool is_reserved_db(const std::string& name);
std::string reject_to_json(const RejectEntry& entry);
// kCorruption naming `where` when `json` is not a reject entry.
RejectEntry reject_from_json(std::string_view json, const std::string& where);

}  // namespace sf::storage
