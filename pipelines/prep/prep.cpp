#include "pipelines/prep/prep.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timeline.h"
#include "model/gemma/text_prompt.h"
#include "pipelines/prep/prep_phases.h"
#include "stages/distributed/launch_env.h"
#include "stages/image/aspect_buckets.h"
#include "storage/cache_schema.h"
#include "storage/cache_shards.h"

namespace sf::pipelines {

// --max_sequence_length at most: a text record of that many 4096-wide fp32 rows stays under the
// reader's bound (storage/cache_schema.h, kMaxTextRecordBytes).
constexpr int kMaxSequenceLength = 2048;
namespace prep {

std::string read_file(const std::string& path, int64_t max_bytes) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw Reject(path + ": cannot open file");
    const std::streamoff size = in.tellg();
    if (size < 0) throw Reject(path + ": cannot read file size");
    if (size > max_bytes) {
        throw Reject(
            fmt::format("{}: file is {} bytes, above the limit of {}", path, size, max_bytes));
    }
    std::string bytes(static_cast<size_t>(size), '\0');
    in.seekg(0);
    if (!in.read(bytes.data(), size)) throw Reject(path + ": read failed");
    return bytes;
}

graph::RunStats run_and_commit(graph::LinearPipeline& pipeline,
                               const std::vector<storage::CacheWriter*>& writers) {
    auto flush = [&] {
        for (storage::CacheWriter* w : writers) {
            if (w != nullptr) w->flush();
        }
    };
    graph::RunStats stats;
    try {
        stats = pipeline.run();
    } catch (...) {
        flush();
        throw;
    }
    flush();
    return stats;
}

void add_reject(storage::CacheWriter& writer, const graph::RejectInfo& r, PrepReport& report) {
    // Stages prefix reasons with the file name; the reject list keys by it.
    const std::string source = r.label.empty() ? fmt::format("item {}", r.index) : r.label;
    std::string reason = r.reason;
    if (reason.rfind(source + ": ", 0) == 0) reason.erase(0, source.size() + 2);
    writer.add_reject(source, r.stage, reason);
    report.add_reject(r.stage, source, reason);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

namespace schema = storage::schema;

// A sharded prep (under a launcher) writes CACHE/shard-R-of-N/ on each rank; one process writes
// CACHE itself. Neither may write into the other's layout, or a shard count another prep made.
void check_shard_layout(const std::string& cache_dir, const distributed::LaunchEnv& env) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool single = fs::exists(fs::path(cache_dir) / "data.mdb", ec);
    if (!env.distributed()) {
        if (!storage::cache_shard_counts(cache_dir).empty()) {
            throw Error::InvalidArgument(fmt::format(
                "--cache_dir {} holds the shards of a sharded prep: prep it again under the same "
                "launcher and number of ranks, or give another --cache_dir",
                cache_dir));
        }
        return;
    }
    if (single) {
        throw Error::InvalidArgument(fmt::format(
            "prep under a data-parallel launch ({}): --cache_dir {} is a cache of one process; a "
            "sharded prep writes one shard folder per rank: give another --cache_dir, or prep in "
            "one process",
            env.describe(), cache_dir));
    }
    const std::set<int> counts = storage::cache_shard_counts(cache_dir);
    if (!counts.empty() && counts != std::set<int>{env.world_size}) {
        throw Error::InvalidArgument(fmt::format(
            "prep under a data-parallel launch ({}): --cache_dir {} holds the shards of a prep "
            "with {} ranks: launch as many ranks, or give another --cache_dir",
            env.describe(), cache_dir, *counts.begin()));
    }
}

void validate(const PrepOptions& o) {
    if (o.cache_dir.empty()) throw Error::InvalidArgument("--cache_dir is required");
    check_shard_layout(o.cache_dir, distributed::launch_env());
    if (o.instance_data_dir.empty() && o.manifest.empty()) {
        throw Error::InvalidArgument("prep needs --instance_data_dir or --manifest");
    }
    if (o.workers < 1)
        throw Error::InvalidArgument(
            fmt::format("--dataloader_num_workers must be >= 1, got {}", o.workers));
    if (o.max_in_flight < 0) throw Error::InvalidArgument("--max_in_flight must be >= 0");
    if (o.commit_batch < 1) throw Error::InvalidArgument("--commit_batch must be >= 1");
    if (o.min_side < 0) throw Error::InvalidArgument("--min_side must be >= 0");
    if (o.vae_batch_size < 1) throw Error::InvalidArgument("--vae_batch_size must be >= 1");
    if (o.max_sequence_length < 1 || o.max_sequence_length > kMaxSequenceLength) {
        throw Error::InvalidArgument(fmt::format("--max_sequence_length must be in [1, {}], got {}",
                                                 kMaxSequenceLength, o.max_sequence_length));
    }
    if (o.text_batch_size < 1) throw Error::InvalidArgument("--text_batch_size must be >= 1");
    for (const auto& prompt : o.validation_prompts) {
        if (prompt.empty() || prompt.size() > schema::kMaxCaptionBytes) {
            throw Error::InvalidArgument(
                fmt::format("--validation_prompt must be 1 to {} bytes, got {}",
                            schema::kMaxCaptionBytes, prompt.size()));
        }
    }
    if (o.model != "tiny" && o.pretrained_model_name_or_path.empty()) {
        throw Error::InvalidArgument(
            "--model must be 'tiny' (or give --pretrained_model_name_or_path), got '" + o.model +
            "'");
    }
    if (o.vae_kind != "dc-ae" && o.vae_kind != "wan") {
        throw Error::InvalidArgument("--vae must be dc-ae or wan, got '" + o.vae_kind + "'");
    }
    if (!(o.video_fps >= 0.0) || !std::isfinite(o.video_fps)) {
        throw Error::InvalidArgument(fmt::format(
            "--video_fps must be 0 (each clip's own rate) or positive, got {}", o.video_fps));
    }
    stages::validate_frame_window_config(o.windows);
    // Before the cache is touched: a run refused here stores no fingerprint.
    require_compute_dtype(resolve_device(o.device), resolve_dtype(o.mixed_precision));
}

// The fields every encoder stage's config shares, from the prep flags.
template <typename Config>
Config encoder_config(const PrepOptions& o, const char* builtin, int batch_size) {
    Config c;
    c.model = stages::ModelSource{o.pretrained_model_name_or_path, builtin, o.seed};
    c.device = o.device;
    c.mixed_precision = o.mixed_precision;
    c.batch_size = batch_size;
    return c;
}

namespace {

// --complex_human_instruction as encode_prompt's list: none, Sana's own ("default"), a file's
// lines, or the text itself as one entry.
std::vector<std::string> instruction_lines(const std::string& flag) {
    if (flag.empty()) return {};
    if (flag == "default") return model::sana_complex_human_instruction();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(flag, ec)) return {flag};
    std::ifstream in(flag);
    if (!in) {
        throw Error::IOError(
            fmt::format("--complex_human_instruction {}: cannot read the file", flag));
    }
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (lines.empty()) {
        throw Error::InvalidArgument(
            fmt::format("--complex_human_instruction {}: the file is empty", flag));
    }
    return lines;
}

}  // namespace

// --resolution as the bucket table it maps to (any multiple of 32: the nearest table).
PrepOptions with_bucket_table(const PrepOptions& given) {
    PrepOptions o = given;
    o.resolution = stages::nearest_bucket_resolution(given.resolution);
    if (o.resolution != given.resolution && !o.center_crop) {
        log_info(
            "prep: --resolution {}: images go to the nearest of Sana's aspect-ratio bucket "
            "tables, {}'s (each keeps its aspect ratio)",
            given.resolution, o.resolution);
    }
    return o;
}

// `square_side`: --center_crop's square (the --resolution given), 0 for the buckets.
PrepStages make_stages(const PrepOptions& o, int square_side) {
    PrepStages s;
    s.decode_config.resolution = o.resolution;
    s.decode_config.square_side = square_side;
    s.decode_config.random_flip = o.random_flip;
    s.decode_config.min_side = o.min_side > 0 ? o.min_side : o.resolution / 4;
    s.decode_config.output_uint8 = true;  // a quarter of the bytes in flight; the VAE normalizes
    s.decoder = std::make_unique<stages::DecodeImageStage>(s.decode_config);
    if (o.text) {
        auto config =
            encoder_config<stages::EncodeTextConfig>(o, "gemma-2-tiny", o.text_batch_size);
        config.offload = o.offload;
        config.max_length = o.max_sequence_length;
        config.complex_human_instruction = instruction_lines(o.complex_human_instruction);
        s.text = std::make_unique<stages::EncodeTextStage>(config);
    }
    if (o.vae && o.vae_kind == "wan") {
        stages::EncodeVideoConfig config;
        config.model = stages::ModelSource{o.pretrained_model_name_or_path, "wan-vae-tiny", o.seed};
        config.device = o.device;
        config.mixed_precision = o.mixed_precision;
        s.video_vae = std::make_unique<stages::EncodeVideoStage>(config);
    } else if (o.vae) {
        s.vae = std::make_unique<stages::EncodeVAEStage>(
            encoder_config<stages::EncodeVAEConfig>(o, "dc-ae-tiny", o.vae_batch_size));
    }
    stages::DecodeVideoConfig video;
    video.resolution = o.resolution;
    video.video_fps = o.video_fps;
    video.windows = o.windows;
    video.min_side = s.decode_config.min_side;
    s.video_decoder = std::make_unique<stages::DecodeVideoStage>(video);
    s.video_decode_fingerprint = {
        {"stage", schema::kDecodeVideoStage},
        {"decoder", s.video_decoder->fingerprint()},
        {"resolution", std::to_string(o.resolution)},
        {"record", "sample-index-v2"},
    };
    s.video_decode_fp_hash = storage::fingerprint_hash(s.video_decode_fingerprint);
    s.decode_fingerprint = {
        {"stage", schema::kDecodeImageStage},
        {"decoder", s.decoder->fingerprint()},
        {"resolution", std::to_string(o.resolution)},
        {"record", "sample-index-v2"},
    };
    s.decode_fp_hash = storage::fingerprint_hash(s.decode_fingerprint);
    if (s.vae) s.vae_fp_hash = storage::fingerprint_hash(s.vae->fingerprint());
    if (s.video_vae) s.vae_fp_hash = storage::fingerprint_hash(s.video_vae->fingerprint());
    if (s.text) s.text_fp_hash = storage::fingerprint_hash(s.text->fingerprint());
    return s;
}

// Each stage's records must have been made the way this run would make them: refused naming
// what differs, or dropped and rebuilt with --rebuild.
void check_fingerprints(storage::Cache& cache, const PrepStages& s, const PrepOptions& o) {
    auto ensure = [&](const char* stage, const storage::Fingerprint& fp, const char* db) {
        if (cache.ensure_fingerprint(stage, fp, {db}, o.rebuild) ==
            storage::FingerprintStatus::kRebuilt) {
            log_warn("prep: --rebuild: the {} stage of {} was dropped and is rebuilt", stage,
                     o.cache_dir);
        }
    };
    ensure(schema::kDecodeImageStage, s.decode_fingerprint, schema::kSamplesDb);
    if (s.text) ensure(schema::kEncodeTextStage, s.text->fingerprint(), schema::kTextDb);
    if (s.vae) ensure(schema::kEncodeVAEStage, s.vae->fingerprint(), schema::kLatentsDb);
    if (s.video_vae) {
        ensure(schema::kEncodeVideoVAEStage, s.video_vae->fingerprint(), schema::kLatentsDb);
    }
}

// The video decode fingerprint is checked only once a clip is found, so an image dataset's cache
// never records one (and a cache made before video support is not refused for lacking it).
void check_video_fingerprint(storage::Cache& cache, const PrepStages& s, const PrepOptions& o) {
    if (cache.ensure_fingerprint(schema::kDecodeVideoStage, s.video_decode_fingerprint,
                                 {schema::kSamplesDb},
                                 o.rebuild) == storage::FingerprintStatus::kRebuilt) {
        log_warn("prep: --rebuild: the {} stage of {} was dropped and is rebuilt",
                 schema::kDecodeVideoStage, o.cache_dir);
    }
}

// The manifest: this dataset's samples, which training reads. Sample records of earlier versions
// of the dataset (an edited caption, a removed image) stay in the cache, reusable, but are not
// trained on.
// Returns the number of samples listed; with none, the manifest is left as it was (an empty or
// wholly rejected dataset must not replace a good training list with an empty one).
size_t write_manifest(storage::Cache& cache, const std::vector<PlannedSample>& plan,
                      const std::set<std::string>& rejected_keys, const VideoResult& video) {
    std::vector<std::string> keys;
    for (const auto& p : plan) {
        if (p.sample.path.empty()) continue;
        if (p.is_clip) {
            // A clip's windows, in window order; a clip rejected before any window has none.
            if (auto it = video.window_keys.find(p.sample.path); it != video.window_keys.end()) {
                keys.insert(keys.end(), it->second.begin(), it->second.end());
            }
        } else if (!rejected_keys.count(p.sample_key)) {
            keys.push_back(p.sample_key);
        }
    }
    if (keys.empty()) return 0;
    storage::CacheWriter manifest(cache, schema::kManifestDb, 1);
    manifest.put(schema::kManifestSamplesKey, schema::manifest_record(keys));
    manifest.flush();
    return keys.size();
}

// A shard whose share of the dataset is empty still lists its (no) samples, so it is complete.
void write_empty_manifest(storage::Cache& cache) {
    storage::CacheWriter manifest(cache, schema::kManifestDb, 1);
    manifest.put(schema::kManifestSamplesKey, schema::manifest_record({}));
    manifest.flush();
}

// Drops from `plan` the samples of other shards (by content key) and those the index rejected;
// returns how many usable samples the whole dataset has.
size_t keep_share(std::vector<PlannedSample>& plan, const PrepShard& shard) {
    size_t usable = 0;
    std::vector<PlannedSample> mine;
    for (auto& p : plan) {
        if (p.sample.path.empty()) continue;
        ++usable;
        if (shard.owns(p.is_clip ? p.clip_key : p.sample_key)) mine.push_back(std::move(p));
    }
    plan = std::move(mine);
    return usable;
}

}  // namespace
}  // namespace prep

std::string PrepReport::table() const {
    std::string out = fmt::format("{:<12} {:>8} {:>8} {:>9} {:>10} {:>12}\n", "stage", "items",
                                  "rejects", "busy s", "items/s", "peak memory");
    for (const auto& s : stages) {
        const double rate = s.seconds > 0 ? static_cast<double>(s.items) / s.seconds : 0.0;
        out += fmt::format("{:<12} {:>8} {:>8} {:>9.2f} {:>10.1f} {:>12}\n", s.name, s.items,
                           s.rejects, s.seconds, rate,
                           s.peak_bytes > 0 ? format_bytes(s.peak_bytes) : "-");
    }
    out += fmt::format(
        "samples: {} scanned, {} already cached, {} written ({} latents, {} texts), {} rejected; "
        "{:.2f} s; "
        "models loaded: {}\n",
        scanned, cached, written, latents_written, texts_written, rejected, seconds,
        models_loaded.empty() ? std::string("none")
                              : fmt::format("{}", fmt::join(models_loaded, ", ")));
    if (!reject_groups.empty()) out += "rejects by reason:\n" + reject_summary();
    return out;
}

namespace {

// A reason with its numbers blanked, so that "800x600 is smaller than 1024" and "640x480 is
// smaller than 1024" count as one reason.
std::string reason_pattern(const std::string& reason) {
    std::string out;
    for (size_t i = 0; i < reason.size(); ++i) {
        if (std::isdigit(static_cast<unsigned char>(reason[i]))) {
            if (out.empty() || out.back() != '#') out += '#';
            while (
                i + 1 < reason.size() &&
                (std::isdigit(static_cast<unsigned char>(reason[i + 1])) || reason[i + 1] == '.'))
                ++i;
        } else {
            out += reason[i];
        }
    }
    return out;
}

}  // namespace

void PrepReport::add_reject(const std::string& stage, const std::string& source,
                            const std::string& reason) {
    const std::string pattern = reason_pattern(reason);
    for (RejectGroup& g : reject_groups) {
        if (g.stage == stage && g.pattern == pattern) {
            ++g.count;
            return;
        }
    }
    reject_groups.push_back({stage, pattern, source, reason, 1});
}

std::string PrepReport::reject_summary(size_t max_groups) const {
    std::vector<const RejectGroup*> groups;
    for (const RejectGroup& g : reject_groups) groups.push_back(&g);
    std::stable_sort(groups.begin(), groups.end(), [](const RejectGroup* a, const RejectGroup* b) {
        return a->count > b->count;
    });
    std::string out;
    for (size_t i = 0; i < groups.size() && i < max_groups; ++i) {
        out +=
            fmt::format("  {} x [{}] {} (e.g. {}: {})\n", groups[i]->count, groups[i]->stage,
                        groups[i]->pattern, groups[i]->example_source, groups[i]->example_reason);
    }
    if (groups.size() > max_groups)
        out += fmt::format("  ... and {} other reasons\n", groups.size() - max_groups);
    return out;
}

PrepReport run_prep(const PrepOptions& options) {
    using namespace prep;
    PrepOptions o = with_bucket_table(options);
    validate(o);
    const distributed::LaunchEnv env = distributed::launch_env();
    const PrepShard shard{env.rank, env.world_size};
    if (shard.count > 1) {
        o.cache_dir =
            (std::filesystem::path(o.cache_dir) / storage::shard_dir_name(shard.rank, shard.count))
                .string();
        log_info("prep: {}: this rank's share of the dataset into {}", env.describe(), o.cache_dir);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const mem::TimelineFile timeline_file(
        (std::filesystem::path(o.cache_dir) / mem::kTimelineFileName).string());
    PrepReport report;
    const PrepStages stages = make_stages(o, o.center_crop ? options.resolution : 0);

    stages::DatasetConfig dataset;
    dataset.instance_data_dir = o.instance_data_dir;
    dataset.manifest = o.manifest;
    dataset.instance_prompt = o.instance_prompt;
    dataset.caption_column = o.caption_column;
    // Candidates by extension; each file is then classified by its content (index phase).
    for (const char* e :
         {"mp4", "mov", "m4v", "mkv", "webm", "avi", "mpg", "mpeg", "ts", "flv", "ogv", "gif"}) {
        dataset.extensions.push_back(e);
    }
    const stages::DatasetScan scan = [&] {
        const mem::Span span("prep", "scan");
        return stages::scan_dataset(dataset);
    }();
    report.scanned = static_cast<int64_t>(scan.samples.size());
    report.stages.push_back(
        {"scan", report.scanned, static_cast<int64_t>(scan.rejects.size()), seconds_since(t0), 0});
    log_info("prep: {} samples found, {} rejected by the scan", scan.samples.size(),
             scan.rejects.size());

    storage::Cache cache = storage::Cache::open(o.cache_dir);
    check_fingerprints(cache, stages, o);
    storage::CacheWriter samples_writer(cache, schema::kSamplesDb,
                                        static_cast<size_t>(o.commit_batch));
    int64_t scan_rejected = 0;  // in this shard
    for (const auto& [source, reason] : scan.rejects) {
        if (!shard.owns(source)) continue;
        samples_writer.add_reject(source, "scan", reason);
        report.add_reject("scan", source, reason);
        ++scan_rejected;
    }

    const auto index_t0 = std::chrono::steady_clock::now();
    IndexResult index = [&] {
        const mem::Span span("prep", "index");
        return run_index_phase(stages, cache, scan.samples, o, samples_writer, report, shard);
    }();
    const size_t usable = keep_share(index.plan, shard);
    std::vector<const PlannedSample*> todo, clips;
    for (const auto& p : index.plan) {
        if (p.sample.path.empty()) continue;
        if (p.is_clip) {
            clips.push_back(&p);
        } else if (p.need_sample || p.need_latent) {
            todo.push_back(&p);
        } else {
            ++report.cached;
        }
    }
    report.stages.push_back({"index", report.scanned, index.rejected, seconds_since(index_t0), 0});
    if (!clips.empty()) check_video_fingerprint(cache, stages, o);
    report.rejected = scan_rejected + index.rejected;

    if (stages.text) {
        const mem::Span span("prep", "text");
        run_text_phase(*stages.text, cache, index.plan, o, report);
    }
    std::set<std::string> rejected_keys;
    {
        const mem::Span span("prep", "image");
        rejected_keys = run_image_phase(stages, cache, std::move(todo), o, samples_writer, report);
    }
    VideoResult video;
    if (!clips.empty()) {
        const mem::Span span("prep", "video");
        video = run_video_phase(stages, cache, clips, o, samples_writer, report);
    }
    if (write_manifest(cache, index.plan, rejected_keys, video) == 0) {
        samples_writer.flush();                  // the rejects, with their reasons
        if (usable > 0 && index.plan.empty()) {  // the other shards have the samples
            write_empty_manifest(cache);
            log_warn("prep: {}: none of the {} samples falls in this rank's shard ({} ranks)",
                     env.describe(), usable, shard.count);
            report.seconds = seconds_since(t0);
            return report;
        }
        const std::string why = report.reject_groups.empty()
                                    ? std::string("; no image or video files found): ")
                                    : "):\n" + report.reject_summary();
        throw Error::InvalidArgument(fmt::format(
            "prep: no usable sample in {} ({} found, {} rejected{}the cache's training list is "
            "left as it was; `sanaflow inspect {}` lists every reject",
            o.instance_data_dir.empty() ? o.manifest : o.instance_data_dir, report.scanned,
            report.rejected, why, o.cache_dir));
    }

    report.seconds = seconds_since(t0);
    log_info(
        "prep: {} samples written, {} cached, {} rejected in {:.2f} s (at most {} samples in "
        "flight)",
        report.written, report.cached, report.rejected, report.seconds, report.max_in_flight);
    return report;
}

}  // namespace sf::pipelines
