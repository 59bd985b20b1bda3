// The video phase: each clip probed and cut into windows of 4k+1 frames; the windows the cache
// lacks are decoded one at a time (a seek to each, so committed windows are never decoded again)
// and encoded chunk by chunk by the video VAE on the device; sample and latent records committed
// per window.
//
//   clips -> expand "decode" (probe, plan, keys; one output per missing window, its frames)
//         -> serial "encode_video_vae" (holds the device lease) -> sink "write"
//
// A window's frames are the only pixels in flight, and the expand stage's token pool bounds how
// many windows exist at once: memory depends on the window and the pool, not on the clip.
#include <fmt/format.h>

#include <algorithm>
#include <any>
#include <map>

#include "core/log.h"
#include "core/memory.h"
#include "graph/device_lease.h"
#include "pipelines/prep/prep_phases.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/content_key.h"

namespace sf::pipelines::prep {
namespace {

namespace schema = storage::schema;

// Windows in flight: one being decoded, one being encoded. A window of 81 frames at 480 x 832 is
// 97 MB of uint8 pixels, so the bound matters more than the overlap.
constexpr int kWindowsInFlight = 2;

// One window in flight: keys, and its frames from decode to encode.
struct WindowItem {
    const PlannedSample* plan = nullptr;
    stages::ClipInfo info;
    stages::FrameWindow window;
    size_t window_index = 0;  // in the clip's plan
    std::string sample_key, latent_key;
    bool need_sample = false, need_latent = false;
    std::vector<at::Tensor> frames;  // uint8 [3, H, W] each
    at::Tensor latent;
};

std::string frames_tag(const stages::FrameWindow& w) {
    return fmt::format("{}:{}", w.start, w.length);
}

schema::Bucket bucket_of(const WindowItem& w) {
    return {w.window.length, w.info.bucket.height, w.info.bucket.width};
}

schema::SampleRecord sample_record(const WindowItem& w, const std::string& fingerprint_hash) {
    schema::SampleRecord s;
    s.source = w.plan->sample.path;
    s.caption = w.plan->sample.caption;
    s.bucket = bucket_of(w);
    s.bucket_ratio = w.info.bucket.ratio;
    s.original_height = w.info.height;
    s.original_width = w.info.width;
    s.latent_key = w.latent_key;
    s.text_key = w.plan->text_key;
    s.fingerprint = fingerprint_hash;
    s.frames = frames_tag(w.window);
    s.stage = schema::kDecodeVideoStage;
    return s;
}

// The expansion of one clip: its missing windows, decoded one per call.
class ClipWindows {
public:
    ClipWindows(const PrepStages& stages, const PlannedSample& plan, std::vector<WindowItem> todo)
        : stages_(stages), plan_(plan), todo_(std::move(todo)) {}

    bool next(std::any& out) {
        while (next_ < todo_.size()) {
            WindowItem item = std::move(todo_[next_++]);
            if (!item.need_latent) {
                // Only the sample record is missing (or prep runs without a VAE): its fields
                // come from the probe, no frame is needed.
                out = std::move(item);
                return true;
            }
            const auto result = stages_.video_decoder->decode(
                plan_.sample.path, {item.window},
                [&](size_t, int64_t, const at::Tensor& rgb) { item.frames.push_back(rgb); });
            if (result.completed.at(0)) {
                out = std::move(item);
                return true;
            }
            if (result.truncated) {
                // The windows before the break were handed out; this and later ones are lost.
                throw Reject(fmt::format("{} (truncated: {} of {} missing windows kept)",
                                         result.truncation_reason, next_ - 1, todo_.size()));
            }
            // The container declared more frames than the stream has: later windows lie past
            // the end too.
            log_warn("prep: {}: window {} lies past the clip's last frame ({} frames reached)",
                     plan_.sample.path, frames_tag(item.window), result.frames_reached);
            return false;
        }
        return false;
    }

private:
    const PrepStages& stages_;
    const PlannedSample& plan_;
    std::vector<WindowItem> todo_;
    size_t next_ = 0;
};

}  // namespace

VideoResult run_video_phase(const PrepStages& stages, storage::Cache& cache,
                            const std::vector<const PlannedSample*>& clips, const PrepOptions& o,
                            storage::CacheWriter& samples_writer, PrepReport& report) {
    VideoResult result;
    // (clip path, window index) -> sample key, of windows cached or written: the manifest's.
    std::map<std::string, std::map<size_t, std::string>> kept;
    auto& memlog = mem::memory_log();
    mem::reset_peak();
    memlog.mark("prep", "before video");
    const auto t0 = std::chrono::steady_clock::now();
    report.clips += static_cast<int64_t>(clips.size());

    const storage::CacheReader sample_records(cache, schema::kSamplesDb);
    const storage::CacheReader latent_records(cache, schema::kLatentsDb);
    std::unique_ptr<storage::CacheWriter> latents_writer;
    if (stages.video_vae) {
        latents_writer =
            std::make_unique<storage::CacheWriter>(cache, schema::kLatentsDb, o.commit_batch);
    }

    // Probe, plan and key one clip; the windows it still needs go to the decoder.
    auto plan_clip = [&](const PlannedSample& p) {
        const stages::ClipInfo info = stages.video_decoder->probe(p.sample.path);
        const std::vector<stages::FrameWindow> windows = stages.video_decoder->plan(info);
        if (windows.empty()) {
            throw Reject(fmt::format(
                "{}: {} frames at {}/{} fps, shorter than the shortest window (--target_frames)",
                p.sample.path, info.frame_count, info.fps_num, info.fps_den));
        }
        report.windows_planned += static_cast<int64_t>(windows.size());
        std::vector<WindowItem> todo;
        for (size_t i = 0; i < windows.size(); ++i) {
            WindowItem w;
            w.plan = &p;
            w.info = info;
            w.window = windows[i];
            w.window_index = i;
            const std::string tag = frames_tag(windows[i]);
            w.sample_key =
                storage::content_key_of(p.clip_key, {{"decoder", stages.video_decode_fp_hash},
                                                     {"window", tag},
                                                     {"caption", p.sample.caption},
                                                     {"vae", stages.vae_fp_hash},
                                                     {"text", stages.text_fp_hash}});
            if (stages.video_vae) {
                w.latent_key =
                    storage::content_key_of(p.clip_key, {{"decoder", stages.video_decode_fp_hash},
                                                         {"window", tag},
                                                         {"vae", stages.vae_fp_hash}});
            }
            w.need_sample = !sample_records.contains(w.sample_key);
            w.need_latent = stages.video_vae && !latent_records.contains(w.latent_key);
            if (w.need_sample || w.need_latent) {
                todo.push_back(std::move(w));
            } else {
                kept[p.sample.path][i] = w.sample_key;
                ++report.cached;
            }
        }
        return todo;
    };

    graph::LinearPipeline pipeline("prep/video", kWindowsInFlight);
    const graph::CancelToken& pipeline_cancel = pipeline.cancel_token();
    // Loaded by the first window that needs a latent: a rerun over cached clips loads nothing.
    graph::DeviceLease::Hold lease;
    std::unique_ptr<stages::EncodeVideoStage::Session> vae;
    int64_t encode_peak = 0;

    size_t next = 0;
    pipeline
        .source(
            "clips",
            [&](std::any& out) {
                if (next >= clips.size()) return false;
                out = clips[next++];
                return true;
            },
            static_cast<int64_t>(clips.size()))
        .describe([](const std::any& item) {
            return std::any_cast<const PlannedSample*>(item)->sample.path;
        })
        .expand("decode",
                [&](std::any&& in) -> graph::LinearPipeline::SourceFn {
                    const PlannedSample& p = *std::any_cast<const PlannedSample*>(in);
                    auto windows = std::make_shared<ClipWindows>(stages, p, plan_clip(p));
                    return [windows](std::any& out) { return windows->next(out); };
                })
        .serial("encode_video_vae",
                [&](std::any&& in) -> std::any {
                    auto item = std::any_cast<WindowItem&&>(std::move(in));
                    if (item.need_latent) {
                        if (!vae) {
                            lease = graph::device_lease().acquire(schema::kEncodeVideoVAEStage,
                                                                  &pipeline_cancel);
                            vae = stages.video_vae->open();
                            report.models_loaded.push_back(schema::kEncodeVideoVAEStage);
                        }
                        vae->begin_window();
                        for (auto& frame : item.frames) {
                            vae->push_frame(frame);
                            frame = at::Tensor();  // pixels leave as soon as they are encoded
                        }
                        item.latent = vae->finish_window();
                        encode_peak = std::max(encode_peak, mem::cpu_stats().peak);
                    }
                    item.frames.clear();
                    return item;
                })
        .holds_device_lease()
        .sink("write",
              [&](std::any&& in) {
                  auto item = std::any_cast<WindowItem&&>(std::move(in));
                  const std::string& path = item.plan->sample.path;
                  if (item.latent.defined()) {
                      latents_writer->put(item.latent_key, stages.video_vae->record(
                                                               item.latent, path, bucket_of(item),
                                                               frames_tag(item.window)));
                      ++report.latents_written;
                  }
                  if (item.need_sample) {
                      samples_writer.put(
                          item.sample_key,
                          sample_record(item, stages.video_decode_fp_hash).to_record());
                      ++report.written;
                  }
                  kept[path][item.window_index] = item.sample_key;
              })
        .on_reject([&](const graph::RejectInfo& r) {
            add_reject(samples_writer, r, report);
            if (r.reason.find("(truncated:") != std::string::npos) ++report.clips_truncated;
            ++report.rejected;
        });

    const graph::RunStats stats = run_and_commit(pipeline, {latents_writer.get(), &samples_writer});
    vae.reset();  // frees the VAE, marks memory, empties the CUDA cache
    lease.release();
    const mem::Mark after = memlog.mark("prep", "after video phase");

    for (auto& [path, windows] : kept) {
        auto& keys = result.window_keys[path];
        for (auto& [index, key] : windows) keys.push_back(std::move(key));
    }
    for (const auto& s : stats.stages) {
        if (s.name == "clips") continue;
        report.stages.push_back({s.name, s.items, s.rejects, s.busy_seconds,
                                 s.name == schema::kEncodeVideoVAEStage ? encode_peak : 0});
    }
    report.stages.push_back(
        {"video", stats.completed, stats.rejected, seconds_since(t0), after.cpu.peak});
    report.max_in_flight = std::max<int64_t>(report.max_in_flight, stats.max_in_flight_observed);
    return result;
}

}  // namespace sf::pipelines::prep
