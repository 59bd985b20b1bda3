// The text phase: the missing captions, each distinct one once, through the text encoder in
// batches, with the encoder on the device (and the lease held) for this phase only.
#include <algorithm>

#include "core/memory.h"
#include "graph/device_lease.h"
#include "graph/progress.h"
#include "pipelines/prep/prep_phases.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"

namespace sf::pipelines::prep {

void run_text_phase(const stages::EncodeTextStage& stage, storage::Cache& cache,
                    const std::vector<PlannedSample>& plan, const PrepOptions& o,
                    PrepReport& report) {
    namespace schema = storage::schema;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> captions;
    std::vector<std::string> validation;  // prompts whose features are not there yet
    bool need_empty = false;
    {
        const storage::CacheReader texts(cache, schema::kTextDb);
        std::set<std::string> seen;
        for (const auto& p : plan) {
            if (p.sample.path.empty() || !seen.insert(p.text_key).second) continue;
            if (!texts.contains(p.text_key)) captions.push_back(p.sample.caption);
        }
        need_empty = !texts.contains(schema::kEmptyPromptKey);
        for (const auto& prompt : o.validation_prompts) {
            if (!seen.insert("validation\n" + prompt).second) continue;
            if (!texts.contains(schema::validation_prompt_key(prompt)))
                validation.push_back(prompt);
        }
    }
    int64_t peak = 0;
    if (!captions.empty() || need_empty || !validation.empty()) {
        auto lease = graph::device_lease().acquire("encode_text");
        storage::CacheWriter writer(cache, schema::kTextDb, static_cast<size_t>(o.commit_batch));
        auto session = stage.open();
        report.models_loaded.push_back("encode_text");
        graph::Progress progress("prep/text", static_cast<int64_t>(captions.size()));
        const size_t bs = static_cast<size_t>(o.text_batch_size);
        for (size_t i = 0; i < captions.size(); i += bs) {
            const std::vector<std::string> batch(
                captions.begin() + i, captions.begin() + std::min(captions.size(), i + bs));
            auto features = session->encode(batch);
            for (size_t j = 0; j < batch.size(); ++j) {
                writer.put(stage.key(batch[j]), stage.record(features[j], batch[j]));
            }
            progress.advance(static_cast<int64_t>(batch.size()));
        }
        // The empty prompt, for training's caption dropout.
        if (need_empty) {
            writer.put(schema::kEmptyPromptKey, stage.record(session->encode_empty(), ""));
        }
        if (!validation.empty()) {
            const std::vector<at::Tensor> features = session->encode(validation);
            for (size_t j = 0; j < validation.size(); ++j) {
                writer.put(schema::validation_prompt_key(validation[j]),
                           stage.record(features[j], validation[j]));
            }
        }
        writer.flush();
        peak = mem::cpu_stats().peak;  // since the model's load reset it
        session.reset();
        report.texts_written = static_cast<int64_t>(captions.size());
    }
    report.stages.push_back(
        {"text", static_cast<int64_t>(captions.size()), 0, seconds_since(t0), peak});
}

}  // namespace sf::pipelines::prep
