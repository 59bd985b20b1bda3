// The index phase: every sample read and hashed in parallel into its content keys; what the cache
// already holds is skipped from here on, so an unchanged dataset loads no model.
#include <any>
#include <fstream>

#include "pipelines/prep/prep_phases.h"
#include "stages/image/aspect_buckets.h"
#include "stages/image/image_header.h"
#include "stages/video/clip_sniff.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/content_key.h"

namespace sf::pipelines::prep {
namespace {

// By the container's magic in the file's first bytes, not by its extension.
bool is_clip_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Reject(path + ": cannot open file");
    char head[stages::kClipSniffBytes] = {};
    in.read(head, sizeof head);
    return stages::looks_like_clip(reinterpret_cast<const uint8_t*>(head),
                                   static_cast<size_t>(in.gcount()));
}

}  // namespace

IndexResult run_index_phase(const PrepStages& stages, storage::Cache& cache,
                            const std::vector<stages::Sample>& samples, const PrepOptions& o,
                            storage::CacheWriter& samples_writer, PrepReport& report,
                            const PrepShard& shard) {
    namespace schema = storage::schema;
    IndexResult result;
    std::vector<PlannedSample>& plan = result.plan;
    plan.resize(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) plan[i].sample = samples[i];

    const storage::CacheReader sample_records(cache, schema::kSamplesDb);
    const storage::CacheReader latent_records(cache, schema::kLatentsDb);
    auto hash_clip = [&](PlannedSample& p) {
        if (stages.vae && !stages.video_vae) {
            throw Reject(p.sample.path +
                         ": a video clip needs the video VAE: rerun with --vae wan (Wan2.1's, as "
                         "SANA-Video uses)");
        }
        // Streamed: a clip may be larger than memory. The windows' keys derive from this one.
        p.is_clip = true;
        p.clip_key = storage::content_key_of_file(p.sample.path, {});
        if (stages.text) p.text_key = stages.text->key(p.sample.caption);
    };
    auto hash = [&](PlannedSample& p) {
        if (is_clip_file(p.sample.path)) {
            hash_clip(p);
            return;
        }
        const std::string bytes = read_file(p.sample.path, stages.decode_config.max_file_bytes);
        const auto header =
            stages::read_image_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        if (header.has_size() && header.width > 0 && header.height > 0) {
            const bool swap = header.orientation >= 5;  // EXIF 5..8 turn the image
            const auto b =
                stages.decoder->bucket_for(static_cast<int>(swap ? header.width : header.height),
                                           static_cast<int>(swap ? header.height : header.width));
            p.predicted_bucket = schema::Bucket{1, b.height, b.width}.name();
        }
        // An edited image or caption gets a new sample key, a renamed file keeps it; the latent
        // depends on the image alone, so a caption edit reuses it. The sample record names its
        // latent and text records, so their stages' fingerprints are part of its key.
        p.sample_key = storage::content_key_of(bytes, {{"decoder", stages.decode_fp_hash},
                                                       {"caption", p.sample.caption},
                                                       {"vae", stages.vae_fp_hash},
                                                       {"text", stages.text_fp_hash}});
        if (stages.has_vae()) {
            p.latent_key = storage::content_key_of(
                bytes, {{"decoder", stages.decode_fp_hash}, {"vae", stages.vae_fp_hash}});
        }
        if (stages.text) p.text_key = stages.text->key(p.sample.caption);
        p.need_sample = !sample_records.contains(p.sample_key);
        p.need_latent = stages.has_vae() && !latent_records.contains(p.latent_key);
    };

    size_t next = 0;
    graph::LinearPipeline index("prep/index", 4 * o.workers);
    index
        .source(
            "samples",
            [&](std::any& out) {
                if (next >= plan.size()) return false;
                out = &plan[next++];
                return true;
            },
            static_cast<int64_t>(plan.size()))
        .describe(
            [](const std::any& item) { return std::any_cast<PlannedSample*>(item)->sample.path; })
        .parallel("hash", o.workers,
                  [&](std::any&& in) -> std::any {
                      hash(*std::any_cast<PlannedSample*>(in));
                      return in;
                  })
        .sink("plan", [](std::any&&) {})
        .on_reject([&](const graph::RejectInfo& r) {
            plan[static_cast<size_t>(r.index)].sample.path.clear();  // dropped from later phases
            if (!shard.owns(r.label)) return;  // another rank's shard records it
            add_reject(samples_writer, r, report);
            ++result.rejected;
        });
    index.run();
    return result;
}

}  // namespace sf::pipelines::prep
