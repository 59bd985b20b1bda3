#include "pipelines/prep.h"

#include <fmt/format.h>

#include <algorithm>
#include <any>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <opencv2/core/utility.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "graph/device_lease.h"
#include "graph/pipeline.h"
#include "stages/aspect_buckets.h"
#include "stages/dataset.h"
#include "stages/decode_image.h"
#include "stages/encode_text.h"
#include "stages/encode_vae.h"
#include "stages/image_header.h"
#include "stages/train_data.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_writer.h"
#include "storage/content_key.h"
#include "storage/fingerprint.h"

namespace sf::pipelines {
namespace {

constexpr const char* kDecodeStage = "decode_image";
constexpr const char* kSamplesDb = "samples";
constexpr const char* kLatentsDb = "latents";
constexpr const char* kTextDb = "text";

// One sample's keys and what the cache lacks of it, from the index phase.
struct PlannedSample {
    Sample sample;
    std::string sample_key;
    std::string latent_key;
    std::string text_key;
    std::string predicted_bucket;  // from the header alone, to order the VAE's work by bucket
    bool need_sample = false;
    bool need_latent = false;
};

// One sample in the image phase. `bytes` lives from read to decode, `pixels` from decode to the
// VAE: the token bound caps both.
struct ImageItem {
    const PlannedSample* plan = nullptr;
    std::string bytes;
    DecodedImage image;
    at::Tensor latent;
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

std::string bucket_name(int h, int w) { return fmt::format("{}x{}", h, w); }

storage::Record sample_record(const PlannedSample& p, const DecodedImage& image, const std::string& fingerprint_hash) {
    namespace meta = storage::record_meta;
    storage::Record r;
    r.tensors["original_size"] = int32_pair(image.orig_h, image.orig_w);
    r.tensors["bucket_size"] = int32_pair(image.bucket_h, image.bucket_w);
    r.metadata[meta::kSource] = p.sample.path;
    r.metadata[meta::kBucket] = bucket_name(image.bucket_h, image.bucket_w);
    r.metadata[meta::kStage] = kDecodeStage;
    r.metadata[meta::kFingerprint] = fingerprint_hash;
    r.metadata["caption"] = p.sample.caption;
    r.metadata["bucket_ratio"] = image.bucket_ratio;
    r.metadata["latent_key"] = p.latent_key;
    r.metadata["text_key"] = p.text_key;
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
    if (o.commit_batch < 1) throw Error::InvalidArgument("--commit_batch must be >= 1");
    if (o.min_side < 0) throw Error::InvalidArgument("--min_side must be >= 0");
    if (o.vae_batch_size < 1) throw Error::InvalidArgument("--vae_batch_size must be >= 1");
    if (o.text_batch_size < 1) throw Error::InvalidArgument("--text_batch_size must be >= 1");
    if (o.model != "tiny" && o.pretrained_model_name_or_path.empty()) {
        throw Error::InvalidArgument("--model must be 'tiny' (or give --pretrained_model_name_or_path), got '" + o.model + "'");
    }
}

// The fields every encoder stage's config shares, from the prep flags.
template <typename Config>
Config encoder_config(const PrepOptions& o, const char* builtin, int batch_size) {
    Config c;
    c.model = ModelSource{o.pretrained_model_name_or_path, builtin, o.seed};
    c.device = o.device;
    c.mixed_precision = o.mixed_precision;
    c.batch_size = batch_size;
    return c;
}

// Reports a reject to the cache: stages prefix reasons with the file name, the list keys by it.
void add_reject(storage::CacheWriter& writer, const graph::RejectInfo& r) {
    const std::string source = r.label.empty() ? fmt::format("item {}", r.index) : r.label;
    std::string reason = r.reason;
    if (reason.rfind(source + ": ", 0) == 0) reason.erase(0, source.size() + 2);
    writer.add_reject(source, r.stage, reason);
}

// The text phase: the missing captions, each distinct one once, through the text encoder in
// batches, with the encoder on the device (and the lease held) for this phase only.
void run_text_phase(const EncodeTextStage& stage, storage::Cache& cache, const std::vector<PlannedSample>& plan,
                    const PrepOptions& o, PrepReport& report) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> captions;
    bool need_empty = false;
    {
        const storage::CacheReader texts(cache, kTextDb);
        std::set<std::string> seen;
        for (const auto& p : plan) {
            if (p.sample.path.empty() || !seen.insert(p.text_key).second) continue;
            if (!texts.contains(p.text_key)) captions.push_back(p.sample.caption);
        }
        need_empty = !texts.contains(kEmptyPromptKey);
    }
    int64_t peak = 0;
    if (!captions.empty() || need_empty) {
        auto lease = graph::device_lease().acquire("encode_text");
        storage::CacheWriter writer(cache, kTextDb, static_cast<size_t>(o.commit_batch));
        auto session = stage.open();
        report.models_loaded.push_back("encode_text");
        graph::Progress progress("prep/text", static_cast<int64_t>(captions.size()));
        const size_t bs = static_cast<size_t>(o.text_batch_size);
        for (size_t i = 0; i < captions.size(); i += bs) {
            const std::vector<std::string> batch(captions.begin() + i,
                                                 captions.begin() + std::min(captions.size(), i + bs));
            auto features = session->encode(batch);
            for (size_t j = 0; j < batch.size(); ++j) {
                writer.put(stage.key(batch[j]), stage.record(features[j], batch[j]));
            }
            progress.advance(static_cast<int64_t>(batch.size()));
        }
        // The empty prompt, for training's caption dropout.
        if (need_empty) writer.put(kEmptyPromptKey, stage.record(session->encode_empty(), ""));
        writer.flush();
        peak = mem::cpu_stats().peak;  // since the model's load reset it
        session.reset();
        report.texts_written = static_cast<int64_t>(captions.size());
    }
    report.stages.push_back({"text", static_cast<int64_t>(captions.size()), 0, seconds_since(t0), peak});
}

}  // namespace

std::string PrepReport::table() const {
    std::string out = fmt::format("{:<12} {:>8} {:>8} {:>9} {:>10} {:>12}\n", "stage", "items", "rejects", "busy s",
                                  "items/s", "peak memory");
    for (const auto& s : stages) {
        const double rate = s.seconds > 0 ? static_cast<double>(s.items) / s.seconds : 0.0;
        out += fmt::format("{:<12} {:>8} {:>8} {:>9.2f} {:>10.1f} {:>12}\n", s.name, s.items, s.rejects, s.seconds,
                           rate, s.peak_bytes > 0 ? format_bytes(s.peak_bytes) : "-");
    }
    out += fmt::format(
        "samples: {} scanned, {} already cached, {} written ({} latents, {} texts), {} rejected; {:.2f} s; "
        "models loaded: {}\n",
        scanned, cached, written, latents_written, texts_written, rejected, seconds,
        models_loaded.empty() ? std::string("none") : fmt::format("{}", fmt::join(models_loaded, ", ")));
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
    decode_config.output_uint8 = true;  // a quarter of the bytes in flight; the VAE normalizes
    const DecodeImageStage decoder(decode_config);

    std::unique_ptr<EncodeTextStage> text_stage;
    if (o.text) {
        auto config = encoder_config<EncodeTextConfig>(o, "gemma-2-tiny", o.text_batch_size);
        config.offload = o.offload;
        text_stage = std::make_unique<EncodeTextStage>(config);
    }
    std::unique_ptr<EncodeVAEStage> vae_stage;
    if (o.vae) vae_stage = std::make_unique<EncodeVAEStage>(encoder_config<EncodeVAEConfig>(o, "dc-ae-tiny", o.vae_batch_size));

    // Scan.
    DatasetConfig dataset;
    dataset.instance_data_dir = o.instance_data_dir;
    dataset.manifest = o.manifest;
    dataset.instance_prompt = o.instance_prompt;
    const DatasetScan scan = scan_dataset(dataset);
    report.scanned = static_cast<int64_t>(scan.samples.size());
    report.stages.push_back({"scan", report.scanned, static_cast<int64_t>(scan.rejects.size()), seconds_since(t0), 0});
    log_info("prep: {} samples found, {} rejected by the scan", scan.samples.size(), scan.rejects.size());

    // Open the cache; each stage's records must have been made the way this run would make them.
    storage::Cache cache = storage::Cache::open(o.cache_dir);
    const storage::Fingerprint decode_fp = {
        {"stage", kDecodeStage},
        {"decoder", decoder.fingerprint()},
        {"resolution", std::to_string(o.resolution)},
        {"record", "sample-index-v2"},
    };
    auto ensure = [&](const char* stage, const storage::Fingerprint& fp, const char* db) {
        if (cache.ensure_fingerprint(stage, fp, {db}, o.rebuild) == storage::FingerprintStatus::kRebuilt) {
            log_warn("prep: --rebuild: the {} stage of {} was dropped and is rebuilt", stage, o.cache_dir);
        }
    };
    ensure(kDecodeStage, decode_fp, kSamplesDb);
    if (text_stage) ensure("encode_text", text_stage->fingerprint(), kTextDb);
    if (vae_stage) ensure("encode_vae", vae_stage->fingerprint(), kLatentsDb);
    const std::string decode_fp_hash = storage::fingerprint_hash(decode_fp);
    const std::string vae_fp_hash = vae_stage ? storage::fingerprint_hash(vae_stage->fingerprint()) : "";
    const std::string text_fp_hash = text_stage ? storage::fingerprint_hash(text_stage->fingerprint()) : "";

    storage::CacheWriter samples_writer(cache, kSamplesDb, static_cast<size_t>(o.commit_batch));
    for (const auto& [source, reason] : scan.rejects) samples_writer.add_reject(source, "scan", reason);

    // --- index: read and hash every image; find what the cache lacks. -------------------------
    const auto index_t0 = std::chrono::steady_clock::now();
    std::vector<PlannedSample> plan(scan.samples.size());
    for (size_t i = 0; i < scan.samples.size(); ++i) plan[i].sample = scan.samples[i];
    {
        const storage::CacheReader samples(cache, kSamplesDb), latents(cache, kLatentsDb);
        size_t next = 0;
        graph::LinearPipeline index("prep/index", 4 * o.workers);
        index.source("samples", [&](std::any& out) {
                 if (next >= plan.size()) return false;
                 out = &plan[next++];
                 return true;
             }, report.scanned)
            .describe([](const std::any& item) { return std::any_cast<PlannedSample*>(item)->sample.path; })
            .parallel("hash", o.workers,
                      [&](std::any&& in) -> std::any {
                          PlannedSample* p = std::any_cast<PlannedSample*>(in);
                          const std::string bytes = read_file(p->sample.path, decode_config.max_file_bytes);
                          const auto header =
                              read_image_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
                          if (header.has_size() && header.width > 0 && header.height > 0) {
                              const bool swap = header.orientation >= 5;  // EXIF 5..8 turn the image
                              const auto& b = closest_aspect_bucket(
                                  o.resolution, static_cast<int>(swap ? header.width : header.height),
                                  static_cast<int>(swap ? header.height : header.width));
                              p->predicted_bucket = bucket_name(b.height, b.width);
                          }
                          // An edited image or caption gets a new sample key, a renamed file keeps it;
                          // the latent depends on the image alone, so a caption edit reuses it.
                          // The sample record names its latent and text records, so their
                          // stages' fingerprints are part of its key.
                          p->sample_key = storage::content_key_of(
                              bytes, {{"decoder", decode_fp_hash}, {"caption", p->sample.caption},
                                      {"vae", vae_fp_hash}, {"text", text_fp_hash}});
                          if (vae_stage) {
                              p->latent_key = storage::content_key_of(
                                  bytes, {{"decoder", decode_fp_hash}, {"vae", vae_fp_hash}});
                          }
                          if (text_stage) p->text_key = text_stage->key(p->sample.caption);
                          p->need_sample = !samples.contains(p->sample_key);
                          p->need_latent = vae_stage && !latents.contains(p->latent_key);
                          return in;
                      })
            .sink("plan", [](std::any&&) {})
            .on_reject([&](const graph::RejectInfo& r) {
                add_reject(samples_writer, r);
                plan[static_cast<size_t>(r.index)].sample.path.clear();  // dropped from later phases
            });
        index.run();
    }
    std::vector<const PlannedSample*> todo;
    int64_t rejected_in_index = 0;
    for (const auto& p : plan) {
        if (p.sample.path.empty()) {
            ++rejected_in_index;
        } else if (p.need_sample || p.need_latent) {
            todo.push_back(&p);
        } else {
            ++report.cached;
        }
    }
    report.stages.push_back({"index", report.scanned, rejected_in_index, seconds_since(index_t0), 0});

    if (text_stage) run_text_phase(*text_stage, cache, plan, o, report);

    // --- image: decode what is missing, and VAE-encode what lacks a latent. -------------------
    // Ordered by predicted bucket, so that the VAE's batches are mostly of one size.
    std::stable_sort(todo.begin(), todo.end(), [](const PlannedSample* a, const PlannedSample* b) {
        return a->predicted_bucket < b->predicted_bucket;
    });
    const bool need_vae = std::any_of(todo.begin(), todo.end(), [](const PlannedSample* p) { return p->need_latent; });
    const int vae_batch = o.vae_batch_size;
    const int tokens = std::max(o.max_in_flight > 0 ? o.max_in_flight : 4 * o.workers, vae_batch);

    cv::setNumThreads(0);  // decode workers run in parallel; OpenCV's own pool would multiply threads
    mem::reset_peak();
    memlog.mark("prep", "before decode");
    const auto image_t0 = std::chrono::steady_clock::now();

    std::unique_ptr<storage::CacheWriter> latents_writer;
    if (vae_stage) latents_writer = std::make_unique<storage::CacheWriter>(cache, kLatentsDb, o.commit_batch);

    graph::LinearPipeline pipeline("prep/image", tokens);
    const graph::CancelToken& pipeline_cancel = pipeline.cancel_token();
    // The VAE is loaded by the first batch that has an image to encode, so a run whose only
    // missing samples are known-bad files (rejected again by the decoder) loads no model.
    graph::DeviceLease::Hold lease;
    std::unique_ptr<EncodeVAEStage::Session> vae;
    auto open_vae = [&] {
        if (vae) return;
        lease = graph::device_lease().acquire("encode_vae", &pipeline_cancel);
        vae = vae_stage->open();
        report.models_loaded.push_back("encode_vae");
    };
    size_t next = 0;
    std::set<std::string> rejected_keys;  // sample keys the image phase rejected
    pipeline
        .source("samples", [&](std::any& out) {
            if (next >= todo.size()) return false;
            out = ImageItem{todo[next++], {}, {}, {}};
            return true;
        }, static_cast<int64_t>(todo.size()))
        .describe([](const std::any& item) { return std::any_cast<const ImageItem&>(item).plan->sample.path; })
        .parallel("decode", o.workers,
                  [&](std::any&& in) -> std::any {
                      auto item = std::any_cast<ImageItem&&>(std::move(in));
                      item.bytes = read_file(item.plan->sample.path, decode_config.max_file_bytes);
                      item.image = decoder.run_bytes(item.bytes, item.plan->sample.path);
                      item.bytes = std::string();
                      return item;
                  });
    if (need_vae) {
        pipeline.serial_batched("encode_vae", vae_batch, [&](std::vector<std::any>&& in) {
            // One forward per bucket present in the batch: only images of one size stack.
            std::map<std::pair<int, int>, std::vector<size_t>> by_bucket;
            std::vector<ImageItem> items;
            for (auto& a : in) items.push_back(std::any_cast<ImageItem&&>(std::move(a)));
            for (size_t i = 0; i < items.size(); ++i) {
                if (items[i].plan->need_latent) by_bucket[{items[i].image.bucket_h, items[i].image.bucket_w}].push_back(i);
            }
            if (!by_bucket.empty()) open_vae();
            for (const auto& [bucket, idx] : by_bucket) {
                std::vector<at::Tensor> pixels;
                for (size_t i : idx) pixels.push_back(items[i].image.pixels);
                auto latents = vae->encode(pixels);
                for (size_t k = 0; k < idx.size(); ++k) items[idx[k]].latent = latents[k];
            }
            std::vector<std::any> out;
            for (auto& item : items) {
                item.image.pixels = at::Tensor();  // the pixels' memory goes back before the write
                out.emplace_back(std::move(item));
            }
            return out;
        }, graph::ItemOrder::kSource);  // batches, and so the latents' bytes, independent of timing
    }
    pipeline
        .sink("write", [&](std::any&& in) {
            auto item = std::any_cast<ImageItem&&>(std::move(in));
            const PlannedSample& p = *item.plan;
            // Latents and samples commit in separate batches, so a crash can leave a sample whose
            // latent is missing: the index phase then finds the latent missing and encodes it.
            if (item.latent.defined()) {
                latents_writer->put(p.latent_key, vae_stage->record(item.latent, p.sample.path,
                                                                    bucket_name(item.image.bucket_h, item.image.bucket_w)));
                ++report.latents_written;
            }
            if (p.need_sample) {
                samples_writer.put(p.sample_key, sample_record(p, item.image, decode_fp_hash));
                ++report.written;
            }
        })
        .on_reject([&](const graph::RejectInfo& r) {
            add_reject(samples_writer, r);
            rejected_keys.insert(todo[static_cast<size_t>(r.index)]->sample_key);
        });

    graph::RunStats stats;
    try {
        stats = pipeline.run();
    } catch (...) {
        // What the sink accepted before the failure is committed; the rerun does the rest.
        if (latents_writer) latents_writer->flush();
        samples_writer.flush();
        throw;
    }
    if (latents_writer) latents_writer->flush();
    samples_writer.flush();
    const int64_t image_peak = need_vae ? mem::cpu_stats().peak : 0;
    vae.reset();  // frees the VAE, marks memory, empties the CUDA cache
    lease.release();
    const mem::Mark after = memlog.mark("prep", "after image phase");

    // The manifest: this dataset's samples, which training reads. Sample records of earlier
    // versions of the dataset (an edited caption, a removed image) stay in the cache, reusable,
    // but are not trained on.
    {
        std::vector<std::string> keys;
        for (const auto& p : plan) {
            if (!p.sample.path.empty() && !rejected_keys.count(p.sample_key)) keys.push_back(p.sample_key);
        }
        storage::CacheWriter manifest(cache, kManifestDb, 1);
        manifest.put(kManifestSamplesKey, manifest_record(keys));
        manifest.flush();
    }

    for (const auto& s : stats.stages) {
        if (s.name == "samples") continue;
        report.stages.push_back({s.name, s.items, s.rejects, s.busy_seconds, s.name == "encode_vae" ? image_peak : 0});
    }
    report.stages.push_back({"image", stats.completed, stats.rejected, seconds_since(image_t0), after.cpu.peak});
    report.rejected = static_cast<int64_t>(scan.rejects.size()) + rejected_in_index + stats.rejected;
    report.seconds = seconds_since(t0);
    log_info("prep: {} samples written, {} cached, {} rejected in {:.2f} s (at most {} samples in flight)",
             report.written, report.cached, report.rejected, report.seconds, stats.max_in_flight_observed);
    return report;
}

}  // namespace sf::pipelines
