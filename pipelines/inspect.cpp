#include "pipelines/inspect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>

#include "core/log.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/cache_shards.h"
#include "storage/fingerprint.h"
#include "storage/tensor_record.h"

namespace sf::pipelines {

namespace {

// Records per bucket, from each record's metadata; caption features have no bucket, so the
// text db gets their token counts instead (a power-of-two histogram and the range); video
// windows are counted per clip.
std::string record_summaries(storage::Cache& cache) {
    std::string out;
    for (const std::string& db : cache.record_dbs()) {
        std::map<std::string, int64_t> buckets;
        std::map<std::string, int64_t> windows_per_clip;  // video windows' sample records by clip
        std::map<int64_t, int64_t> token_bins;            // upper bound of the bin -> records
        int64_t tokens_min = INT64_MAX, tokens_max = 0, tokens_sum = 0, with_tokens = 0;
        storage::CacheReader reader(cache, db);
        reader.for_each([&](std::string_view key, std::string_view frame) {
            try {
                auto record = storage::decode_record(frame, std::string(key),
                                                     storage::schema::max_record_bytes(db));
                if (auto t = record.metadata.find(storage::schema::kTokens);
                    t != record.metadata.end()) {
                    const int64_t n = std::stoll(t->second);
                    int64_t bin = 1;
                    while (bin < n) bin *= 2;
                    ++token_bins[bin];
                    tokens_min = std::min(tokens_min, n);
                    tokens_max = std::max(tokens_max, n);
                    tokens_sum += n;
                    ++with_tokens;
                    return;
                }
                auto it = record.metadata.find(storage::schema::kBucket);
                ++buckets[it == record.metadata.end() ? "(none)" : it->second];
                if (db == storage::schema::kSamplesDb &&
                    record.metadata.count(storage::schema::kFrames) != 0) {
                    ++windows_per_clip[record.metadata[storage::schema::kSource]];
                }
            } catch (const std::exception&) {
                ++buckets["(unreadable)"];
            }
        });
        if (with_tokens > 0) {
            out += fmt::format(
                "{} tokens per record: min {} mean {:.1f} max {}; up to", db, tokens_min,
                static_cast<double>(tokens_sum) / static_cast<double>(with_tokens), tokens_max);
            for (const auto& [bin, n] : token_bins) out += fmt::format(" {}={}", bin, n);
            out += "\n";
        }
        if (!buckets.empty()) {
            out += fmt::format("{} per bucket:", db);
            for (const auto& [bucket, n] : buckets) out += fmt::format(" {}={}", bucket, n);
            out += "\n";
        }
        if (!windows_per_clip.empty()) {
            // Buckets of video windows read frames x height x width.
            int64_t least = INT64_MAX, most = 0, all = 0;
            for (const auto& [clip, n] : windows_per_clip) {
                least = std::min(least, n);
                most = std::max(most, n);
                all += n;
            }
            out += fmt::format(
                "{} clips: {}, windows per clip: min {} mean {:.1f} max {}\n", db,
                windows_per_clip.size(), least,
                static_cast<double>(all) / static_cast<double>(windows_per_clip.size()), most);
        }
    }

    return out;
}

InspectResult inspect_one(const std::string& cache_dir, bool verify) {
    storage::CacheOptions options;
    options.create = false;
    options.read_only = true;
    storage::Cache cache = storage::Cache::open(cache_dir, options);
    InspectResult result;
    std::string& out = result.text;

    out += fmt::format("cache {}\n", cache_dir);
    out += fmt::format("{:<14} {:>9} {:>12} {:>14} {:>7}\n", "db", "entries", "stored",
                       "uncompressed", "ratio");
    for (const auto& s : cache.stats()) {
        const bool is_record_db = !storage::is_reserved_db(s.db);
        const std::string ratio =
            is_record_db && s.stored_bytes > 0
                ? fmt::format("{:.2f}", static_cast<double>(s.uncompressed_bytes) /
                                            static_cast<double>(s.stored_bytes))
                : "-";
        out += fmt::format("{:<14} {:>9} {:>12} {:>14} {:>7}\n", s.db, s.entries,
                           format_bytes(s.stored_bytes),
                           is_record_db ? format_bytes(s.uncompressed_bytes) : "-", ratio);
    }

    out += record_summaries(cache);

    out += "fingerprints:\n";
    for (const auto& [stage, fp] : cache.fingerprints()) {
        out += fmt::format("  {} {}\n", stage, storage::fingerprint_hash(fp));
        for (const auto& [field, value] : fp) out += fmt::format("    {} = {}\n", field, value);
    }

    const auto rejects = cache.rejects();
    out += fmt::format("rejects: {}\n", rejects.size());
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < rejects.size() && i < kShown; ++i) {
        out +=
            fmt::format("  [{}] {}: {}\n", rejects[i].stage, rejects[i].source, rejects[i].reason);
    }
    if (rejects.size() > kShown) out += fmt::format("  ... and {} more\n", rejects.size() - kShown);

    if (verify) {
        const auto report = cache.verify_all();
        out += fmt::format("verify: {} ok, {} corrupt\n", report.ok, report.corrupt);
        for (const auto& db : report.dbs) {
            // Every corrupt key is kept; messages only for the first ones.
            for (size_t i = 0; i < db.corrupt_keys.size(); ++i) {
                out += fmt::format("  corrupt {}/{}{}{}\n", db.db, db.corrupt_keys[i],
                                   i < db.errors.size() ? ": " : "",
                                   i < db.errors.size() ? db.errors[i] : "");
            }
        }
        result.ok = report.corrupt == 0;
    }
    return result;
}

}  // namespace

InspectResult inspect_cache(const std::string& cache_dir, bool verify) {
    const std::vector<std::string> shards = storage::cache_shard_dirs(cache_dir);
    if (shards.size() == 1) return inspect_one(shards.front(), verify);
    // A sharded prep's cache: each shard in turn, verified alike.
    InspectResult result;
    result.text = fmt::format("cache {}: {} shards of a sharded prep\n", cache_dir, shards.size());
    std::vector<std::string> bad;
    for (const auto& dir : shards) {
        const InspectResult one = inspect_one(dir, verify);
        result.text += "\n" + one.text;
        if (!one.ok) bad.push_back(std::filesystem::path(dir).filename().string());
    }
    if (verify) {
        result.text += bad.empty()
                           ? fmt::format("verify: all {} shards ok\n", shards.size())
                           : fmt::format("verify: corrupt records in {}\n", fmt::join(bad, ", "));
    }
    result.ok = bad.empty();
    return result;
}

}  // namespace sf::pipelines
