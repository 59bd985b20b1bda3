// The image phase: the missing images decoded in parallel while the VAE encodes batches of one
// bucket on the device; samples and latents committed in batches.
#include <algorithm>
#include <any>
#include <map>
#include <opencv2/core/utility.hpp>

#include "core/memory.h"
#include "graph/device_lease.h"
#include "pipelines/prep/prep_phases.h"
#include "storage/cache_schema.h"

namespace sf::pipelines::prep {
namespace {

namespace schema = storage::schema;

// One sample in flight. `bytes` lives from read to decode, `image.pixels` from decode to the
// VAE: the token bound caps both.
struct ImageItem {
    const PlannedSample* plan = nullptr;
    std::string bytes;
    stages::DecodedImage image;
    at::Tensor latent;
};

schema::Bucket bucket_of(const stages::DecodedImage& image) {
    return {1, image.bucket_h, image.bucket_w};
}

schema::SampleRecord sample_record(const PlannedSample& p, const stages::DecodedImage& image,
                                   const std::string& fingerprint_hash) {
    schema::SampleRecord s;
    s.source = p.sample.path;
    s.caption = p.sample.caption;
    s.bucket = bucket_of(image);
    s.bucket_ratio = image.bucket_ratio;
    s.original_height = image.orig_h;
    s.original_width = image.orig_w;
    s.latent_key = p.latent_key;
    s.text_key = p.text_key;
    s.fingerprint = fingerprint_hash;
    return s;
}

}  // namespace

std::set<std::string> run_image_phase(const PrepStages& stages, storage::Cache& cache,
                                      std::vector<const PlannedSample*> todo, const PrepOptions& o,
                                      storage::CacheWriter& samples_writer, PrepReport& report) {
    // Ordered by predicted bucket, so that the VAE's batches are mostly of one size.
    std::stable_sort(todo.begin(), todo.end(), [](const PlannedSample* a, const PlannedSample* b) {
        return a->predicted_bucket < b->predicted_bucket;
    });
    const bool need_vae = std::any_of(todo.begin(), todo.end(),
                                      [](const PlannedSample* p) { return p->need_latent; });
    const int vae_batch = o.vae_batch_size;
    const int tokens = std::max(o.max_in_flight > 0 ? o.max_in_flight : 4 * o.workers, vae_batch);

    cv::setNumThreads(
        0);  // decode workers run in parallel; OpenCV's own pool would multiply threads
    auto& memlog = mem::memory_log();
    mem::reset_peak();
    memlog.mark("prep", "before decode");
    const auto t0 = std::chrono::steady_clock::now();

    std::unique_ptr<storage::CacheWriter> latents_writer;
    if (stages.has_vae()) {
        latents_writer =
            std::make_unique<storage::CacheWriter>(cache, schema::kLatentsDb, o.commit_batch);
    }

    graph::LinearPipeline pipeline("prep/image", tokens);
    const graph::CancelToken& pipeline_cancel = pipeline.cancel_token();
    // The VAE is loaded by the first batch that has an image to encode, so a run whose only
    // missing samples are known-bad files (rejected again by the decoder) loads no model.
    graph::DeviceLease::Hold lease;
    std::unique_ptr<stages::EncodeVAEStage::Session> vae;
    std::unique_ptr<stages::EncodeVideoStage::Session> video_vae;  // --vae wan
    const char* vae_stage =
        stages.video_vae ? schema::kEncodeVideoVAEStage : schema::kEncodeVAEStage;
    auto open_vae = [&] {
        if (vae || video_vae) return;
        lease = graph::device_lease().acquire(vae_stage, &pipeline_cancel);
        if (stages.video_vae) {
            video_vae = stages.video_vae->open();
        } else {
            vae = stages.vae->open();
        }
        report.models_loaded.push_back(vae_stage);
    };
    // The video VAE takes an image as a one-frame video: [C, 1, h, w].
    auto encode_images = [&](const std::vector<at::Tensor>& pixels) {
        if (vae) return vae->encode(pixels);
        std::vector<at::Tensor> latents;
        for (const auto& image : pixels) {
            video_vae->begin_window();
            video_vae->push_frame(image);
            latents.push_back(video_vae->finish_window());
        }
        return latents;
    };
    auto encode_batch = [&](std::vector<std::any>&& in) {
        // One forward per bucket present in the batch: only images of one size stack.
        std::map<std::pair<int, int>, std::vector<size_t>> by_bucket;
        std::vector<ImageItem> items;
        for (auto& a : in) items.push_back(std::any_cast<ImageItem&&>(std::move(a)));
        for (size_t i = 0; i < items.size(); ++i) {
            if (!items[i].plan->need_latent) continue;
            by_bucket[{items[i].image.bucket_h, items[i].image.bucket_w}].push_back(i);
        }
        if (!by_bucket.empty()) open_vae();
        for (const auto& [bucket, idx] : by_bucket) {
            std::vector<at::Tensor> pixels;
            for (size_t i : idx) pixels.push_back(items[i].image.pixels);
            auto latents = encode_images(pixels);
            for (size_t k = 0; k < idx.size(); ++k) items[idx[k]].latent = latents[k];
        }
        std::vector<std::any> out;
        for (auto& item : items) {
            item.image.pixels = at::Tensor();  // the pixels' memory goes back before the write
            out.emplace_back(std::move(item));
        }
        return out;
    };

    size_t next = 0;
    std::set<std::string> rejected_keys;
    pipeline
        .source(
            "samples",
            [&](std::any& out) {
                if (next >= todo.size()) return false;
                out = ImageItem{todo[next++], {}, {}, {}};
                return true;
            },
            static_cast<int64_t>(todo.size()))
        .describe([](const std::any& item) {
            return std::any_cast<const ImageItem&>(item).plan->sample.path;
        })
        .parallel("decode", o.workers, [&](std::any&& in) -> std::any {
            auto item = std::any_cast<ImageItem&&>(std::move(in));
            item.bytes = read_file(item.plan->sample.path, stages.decode_config.max_file_bytes);
            item.image = stages.decoder->run_bytes(item.bytes, item.plan->sample.path);
            item.bytes = std::string();
            return item;
        });
    if (need_vae) {
        // Batches cut in source order, so the latents' bytes do not depend on timing.
        pipeline.serial_batched(vae_stage, vae_batch, encode_batch, graph::ItemOrder::kSource)
            .holds_device_lease();
    }
    pipeline
        .sink("write",
              [&](std::any&& in) {
                  auto item = std::any_cast<ImageItem&&>(std::move(in));
                  const PlannedSample& p = *item.plan;
                  // Latents and samples commit in separate batches, so a crash can leave a
                  // sample whose latent is missing: the index phase then finds the latent
                  // missing and encodes it.
                  if (item.latent.defined()) {
                      latents_writer->put(p.latent_key,
                                          stages.video_vae
                                              ? stages.video_vae->record(item.latent, p.sample.path,
                                                                         bucket_of(item.image), "")
                                              : stages.vae->record(item.latent, p.sample.path,
                                                                   bucket_of(item.image)));
                      ++report.latents_written;
                  }
                  if (p.need_sample) {
                      samples_writer.put(
                          p.sample_key,
                          sample_record(p, item.image, stages.decode_fp_hash).to_record());
                      ++report.written;
                  }
              })
        .on_reject([&](const graph::RejectInfo& r) {
            add_reject(samples_writer, r, report);
            rejected_keys.insert(todo[static_cast<size_t>(r.index)]->sample_key);
        });

    const graph::RunStats stats = run_and_commit(pipeline, {latents_writer.get(), &samples_writer});
    const int64_t image_peak = need_vae ? mem::cpu_stats().peak : 0;
    vae.reset();  // frees the VAE, marks memory, empties the CUDA cache
    video_vae.reset();
    lease.release();
    const mem::Mark after = memlog.mark("prep", "after image phase");

    for (const auto& s : stats.stages) {
        if (s.name == "samples") continue;
        report.stages.push_back(
            {s.name, s.items, s.rejects, s.busy_seconds, s.name == vae_stage ? image_peak : 0});
    }
    report.stages.push_back(
        {"image", stats.completed, stats.rejected, seconds_since(t0), after.cpu.peak});
    report.rejected += stats.rejected;
    report.max_in_flight = stats.max_in_flight_observed;
    return rejected_keys;
}

}  // namespace sf::pipelines::prep
