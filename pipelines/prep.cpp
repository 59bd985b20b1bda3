#include "pipelines/prep.h"

#include <fmt/format.h>

#include <any>
#include <chrono>
#include <fstream>
#include <opencv2/core/utility.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "graph/pipeline.h"
#include "stages/dataset.h"
#include "stages/decode_image.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_writer.h"
#include "storage/content_key.h"
#include "storage/fingerprint.h"

namespace sf::pipelines {
namespace {

constexpr const char* kDecodeStage = "decode_image";
constexpr const char* kSamplesDb = "samples";

// One sample as it moves through the graph. `bytes` lives from read to decode only, so the
// token bound caps the encoded bytes in memory too.
struct PrepItem {
    Sample sample;
    std::string key;
    std::string bytes;
    bool cached = false;
    storage::Record record;
};

std::string read_file(const std::string& path, int64_t max_bytes) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw Reject(path + ": cannot open file");
    const std::streamoff size = in.tellg();
    if (size < 0) throw Reject(path + ": cannot read file size");
    if (size > max_bytes) {
        throw Reject(fmt::format("{}: file is {} bytes, above the limit of {}", path, size, max_bytes));
    }
    std::string bytes(static_cast<size_t>(size), '\0');
    in.seekg(0);
    if (!in.read(bytes.data(), size)) throw Reject(path + ": read failed");
    return bytes;
}

storage::TensorData int32_pair(int a, int b) {
    storage::TensorData t;
    t.dtype = storage::DType::kI32;
    t.shape = {2};
    const int32_t v[2] = {a, b};
    t.bytes.assign(reinterpret_cast<const char*>(v), sizeof(v));
    return t;
}

storage::Record sample_record(const Sample& sample, const DecodedImage& image,
                              const std::string& fingerprint_hash) {
    namespace meta = storage::record_meta;
    storage::Record r;
    r.tensors["original_size"] = int32_pair(image.orig_h, image.orig_w);
    r.tensors["bucket_size"] = int32_pair(image.bucket_h, image.bucket_w);
    r.metadata[meta::kSource] = sample.path;
    r.metadata[meta::kBucket] = fmt::format("{}x{}", image.bucket_h, image.bucket_w);
    r.metadata[meta::kStage] = kDecodeStage;
    r.metadata[meta::kFingerprint] = fingerprint_hash;
    r.metadata["caption"] = sample.caption;
    r.metadata["bucket_ratio"] = image.bucket_ratio;
    return r;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void validate(const PrepOptions& o) {
    if (o.cache_dir.empty()) throw Error::InvalidArgument("--cache_dir is required");
    if (o.instance_data_dir.empty() && o.manifest.empty()) {
        throw Error::InvalidArgument("prep needs --instance_data_dir or --manifest");
    }
    if (o.workers < 1) throw Error::InvalidArgument(fmt::format("--dataloader_num_workers must be >= 1, got {}", o.workers));
    if (o.max_in_flight < 0) throw Error::InvalidArgument("--max_in_flight must be >= 0");
    if (o.commit_batch < 1) throw Error::InvalidArgument("commit batch must be >= 1");
    if (o.min_side < 0) throw Error::InvalidArgument("--min_side must be >= 0");
}

}  // namespace

std::string PrepReport::table() const {
    std::string out = fmt::format("{:<10} {:>8} {:>8} {:>9} {:>10} {:>12}\n", "stage", "items", "rejects",
                                  "busy s", "items/s", "peak memory");
    for (const auto& s : stages) {
        const double rate = s.seconds > 0 ? static_cast<double>(s.items) / s.seconds : 0.0;
        out += fmt::format("{:<10} {:>8} {:>8} {:>9.2f} {:>10.1f} {:>12}\n", s.name, s.items, s.rejects,
                           s.seconds, rate, s.peak_bytes > 0 ? format_bytes(s.peak_bytes) : "-");
    }
    out += fmt::format("samples: {} scanned, {} already cached, {} written, {} rejected; {:.2f} s\n", scanned,
                       cached, written, rejected, seconds);
    return out;
}

PrepReport run_prep(const PrepOptions& o) {
    validate(o);
    const auto t0 = std::chrono::steady_clock::now();
    auto& memlog = mem::memory_log();
    PrepReport report;

    DecodeImageConfig decode_config;
    decode_config.resolution = o.resolution;
    decode_config.min_side = o.min_side > 0 ? o.min_side : o.resolution / 4;
    // A quarter of the bytes in flight; the VAE stage normalizes on its device.
    decode_config.output_uint8 = true;
    const DecodeImageStage decoder(decode_config);

    // Scan.
    DatasetConfig dataset;
    dataset.instance_data_dir = o.instance_data_dir;
    dataset.manifest = o.manifest;
    dataset.instance_prompt = o.instance_prompt;
    const DatasetScan scan = scan_dataset(dataset);
    report.scanned = static_cast<int64_t>(scan.samples.size());
    report.stages.push_back({"scan", report.scanned, static_cast<int64_t>(scan.rejects.size()), seconds_since(t0), 0});
    log_info("prep: {} samples found, {} rejected by the scan", scan.samples.size(), scan.rejects.size());

    // Open the cache and check that its decode stage was made the way this run would make it.
    storage::Cache cache = storage::Cache::open(o.cache_dir);
    const storage::Fingerprint fingerprint = {
        {"stage", kDecodeStage},
        {"decoder", decoder.fingerprint()},
        {"resolution", std::to_string(o.resolution)},
        {"record", "sample-index-v1"},
    };
    const auto status = cache.ensure_fingerprint(kDecodeStage, fingerprint, {kSamplesDb}, o.rebuild);
    if (status == storage::FingerprintStatus::kRebuilt) {
        log_warn("prep: --rebuild: the {} stage of {} was dropped and is rebuilt", kDecodeStage, o.cache_dir);
    }
    const std::string fingerprint_hash = storage::fingerprint_hash(fingerprint);

    storage::CacheWriter writer(cache, kSamplesDb, static_cast<size_t>(o.commit_batch));
    const storage::CacheReader existing(cache, kSamplesDb);
    for (const auto& [source, reason] : scan.rejects) writer.add_reject(source, "scan", reason);

    // Decode workers run in parallel with each other; OpenCV's own pool would multiply threads.
    cv::setNumThreads(0);
    const int tokens = o.max_in_flight > 0 ? o.max_in_flight : 4 * o.workers;
    mem::reset_peak();
    memlog.mark("prep", "before decode");
    const auto decode_t0 = std::chrono::steady_clock::now();

    graph::LinearPipeline pipeline("prep", tokens);
    size_t next = 0;
    pipeline
        .source(
            "samples",
            [&](std::any& out) {
                if (next >= scan.samples.size()) return false;
                out = PrepItem{scan.samples[next++], {}, {}, false, {}};
                return true;
            },
            report.scanned)
        .describe([](const std::any& item) { return std::any_cast<const PrepItem&>(item).sample.path; })
        .parallel("read",  o.workers,
                  [&](std::any&& in) -> std::any {
                      auto item = std::any_cast<PrepItem&&>(std::move(in));
                      item.bytes = read_file(item.sample.path, decode_config.max_file_bytes);
                      // A sample is an (image, caption) pair under this decoder: an edited image
                      // or caption gets a new key, a renamed file keeps its key.
                      storage::ContentKey key;
                      key.add_source(item.bytes)
                          .add_param("caption", item.sample.caption)
                          .add_param("decoder", fingerprint_hash);
                      item.key = key.hex();
                      item.cached = existing.contains(item.key);
                      if (item.cached) item.bytes.clear();
                      return item;
                  })
        .parallel("decode", o.workers,
                  [&](std::any&& in) -> std::any {
                      auto item = std::any_cast<PrepItem&&>(std::move(in));
                      if (item.cached) return item;
                      DecodedImage image = decoder.run_bytes(item.bytes, item.sample.path);
                      item.bytes = std::string();
                      item.record = sample_record(item.sample, image, fingerprint_hash);
                      return item;
                  })
        .sink("write",
              [&](std::any&& in) {
                  auto item = std::any_cast<PrepItem&&>(std::move(in));
                  if (item.cached) {
                      ++report.cached;
                      return;
                  }
                  writer.put(item.key, item.record);
                  ++report.written;
              })
        .on_reject([&](const graph::RejectInfo& r) {
            const std::string source = r.label.empty() ? fmt::format("item {}", r.index) : r.label;
            // Stages prefix their reasons with the file name; the reject list keys by it already.
            std::string reason = r.reason;
            if (reason.rfind(source + ": ", 0) == 0) reason.erase(0, source.size() + 2);
            writer.add_reject(source, r.stage, reason);
        });

    graph::RunStats stats;
    try {
        stats = pipeline.run();
    } catch (...) {
        // What the sink accepted before the failure is committed; the rerun does the rest.
        writer.flush();
        throw;
    }
    writer.flush();
    const mem::Mark after = memlog.mark("prep", "after decode");

    for (const auto& s : stats.stages) {
        if (s.name == "samples") continue;
        report.stages.push_back({s.name, s.items, s.rejects, s.busy_seconds, 0});
    }
    report.stages.push_back({"total", stats.completed, stats.rejected, seconds_since(decode_t0), after.cpu.peak});
    report.rejected = static_cast<int64_t>(scan.rejects.size()) + stats.rejected;
    report.seconds = seconds_since(t0);
    log_info("prep: {} written, {} cached, {} rejected in {:.2f} s (at most {} samples in flight)", report.written,
             report.cached, report.rejected, report.seconds, stats.max_in_flight_observed);
    return report;
}

}  // namespace sf::pipelines
