#include "pipelines/inspect.h"

#include <fmt/format.h>

#include <map>

#include "core/log.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/fingerprint.h"
#include "storage/tensor_record.h"

namespace sf::pipelines {

InspectResult inspect_cache(const std::string& cache_dir, bool verify) {
    storage::CacheOptions options;
    options.create = false;
    options.read_only = true;
    storage::Cache cache = storage::Cache::open(cache_dir, options);
    InspectResult result;
    std::string& out = result.text;

    out += fmt::format("cache {}\n", cache_dir);
    out += fmt::format("{:<14} {:>9} {:>12} {:>14} {:>7}\n", "db", "entries", "stored", "uncompressed", "ratio");
    for (const auto& s : cache.stats()) {
        const bool is_record_db = !storage::is_reserved_db(s.db);
        const std::string ratio = is_record_db && s.stored_bytes > 0
                                      ? fmt::format("{:.2f}", static_cast<double>(s.uncompressed_bytes) /
                                                                  static_cast<double>(s.stored_bytes))
                                      : "-";
        out += fmt::format("{:<14} {:>9} {:>12} {:>14} {:>7}\n", s.db, s.entries, format_bytes(s.stored_bytes),
                           is_record_db ? format_bytes(s.uncompressed_bytes) : "-", ratio);
    }

    // Records per bucket, from each record's metadata.
    for (const std::string& db : cache.record_dbs()) {
        std::map<std::string, int64_t> buckets;
        storage::CacheReader reader(cache, db);
        reader.for_each([&](std::string_view key, std::string_view frame) {
            try {
                auto record = storage::decode_record(frame, std::string(key));
                auto it = record.metadata.find(storage::record_meta::kBucket);
                ++buckets[it == record.metadata.end() ? "(none)" : it->second];
            } catch (const Error&) {
                ++buckets["(unreadable)"];
            }
        });
        out += fmt::format("{} per bucket:", db);
        for (const auto& [bucket, n] : buckets) out += fmt::format(" {}={}", bucket, n);
        out += "\n";
    }

    out += "fingerprints:\n";
    for (const auto& [stage, fp] : cache.fingerprints()) {
        out += fmt::format("  {} {}\n", stage, storage::fingerprint_hash(fp));
        for (const auto& [field, value] : fp) out += fmt::format("    {} = {}\n", field, value);
    }

    const auto rejects = cache.rejects();
    out += fmt::format("rejects: {}\n", rejects.size());
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < rejects.size() && i < kShown; ++i) {
        out += fmt::format("  [{}] {}: {}\n", rejects[i].stage, rejects[i].source, rejects[i].reason);
    }
    if (rejects.size() > kShown) out += fmt::format("  ... and {} more\n", rejects.size() - kShown);

    if (verify) {
        const auto report = cache.verify_all();
        out += fmt::format("verify: {} ok, {} corrupt\n", report.ok, report.corrupt);
        for (const auto& db : report.dbs) {
            // Every corrupt key is kept; messages only for the first ones.
            for (size_t i = 0; i < db.corrupt_keys.size(); ++i) {
                out += fmt::format("  corrupt {}/{}{}{}\n", db.db, db.corrupt_keys[i], i < db.errors.size() ? ": " : "",
                                   i < db.errors.size() ? db.errors[i] : "");
            }
        }
        result.ok = report.corrupt == 0;
    }
    return result;
}

}  // namespace sf::pipelines
