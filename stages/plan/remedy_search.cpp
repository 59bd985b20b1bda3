#include "stages/plan/remedy_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sf::plan {

const std::vector<std::string>& searchable_remedies() {
    static const std::vector<std::string> names = {
        "mixed_precision", "gradient_checkpointing", "accumulation",
        "attention",       "ff_chunk_size",          "fused_backward",
        "optimizer",       "blocks_to_swap",         "offload_optimizer"};
    return names;
}

namespace {

// Each remedy's values: the given one alone unless it may vary.
std::vector<PlanRemedies> combinations(const PlanShape& s, const PlanRemedies& given,
                                       const std::set<std::string>& vary) {
    auto varies = [&vary](const char* name) { return vary.count(name) > 0; };
    std::vector<std::string> precisions = {given.mixed_precision};
    if (varies("mixed_precision")) precisions = {"no", "bf16"};
    std::vector<int64_t> checkpointing = {given.gradient_checkpointing};
    if (varies("gradient_checkpointing")) checkpointing = {0, 1};
    std::vector<int64_t> accumulations = {given.accumulation};
    if (varies("accumulation")) {
        accumulations.clear();
        const int64_t items = s.batch / std::max<int64_t>(1, s.samples_per_item);
        for (int64_t a = 1; a <= items; a *= 2)
            if (items % a == 0) accumulations.push_back(a);
    }
    std::vector<std::string> attentions = {given.attention};
    if (varies("attention")) attentions = {"dense", "chunked"};
    const Structure st = structure_of(s);
    std::vector<int64_t> ff = {given.ff_chunk_size};
    if (varies("ff_chunk_size")) {
        ff = {0};
        // Eight chunks of an image's rows, where there are 16 or more; one frame of a video.
        if (!st.video && st.rows >= 16) ff.push_back(st.rows / 8);
        if (st.video && st.frames >= 2) ff.push_back(1);
    }
    std::vector<bool> fused = {given.fused_backward};
    if (varies("fused_backward")) fused = {false, true};
    std::vector<std::string> optimizers = {given.optimizer};
    // Prodigy is an optimizer of its own, not a remedy: kept when given.
    if (varies("optimizer") && given.optimizer != "prodigy") optimizers = {"adamw", "adamw8bit"};

    // Block swap as musubi-tuner uses it, beside checkpointing every block: a quarter, half or
    // all but one of them. (Swap without checkpointing recomputes the swapped blocks only, which
    // would need a calibration of its own for each count.)
    const int64_t layers = st.layers;
    std::vector<int64_t> swaps = {given.blocks_to_swap};
    if (varies("blocks_to_swap")) {
        swaps = {0};
        for (int64_t n : {layers / 4, layers / 2, layers - 1})
            if (n > 0 && std::find(swaps.begin(), swaps.end(), n) == swaps.end())
                swaps.push_back(n);
    }
    std::vector<bool> offloads = {given.offload_optimizer};
    if (varies("offload_optimizer")) offloads = {false, true};
    std::vector<PlanRemedies> out;
    auto add = [&](PlanRemedies r) {
        for (int64_t swap : swaps) {
            if (swap > 0 && (r.fused_backward ||
                             (swap != given.blocks_to_swap && r.gradient_checkpointing != 1)))
                continue;  // the trainer refuses swap with the fused pass
            if (r.optimizer == "prodigy" && r.fused_backward)
                continue;  // Prodigy needs every gradient before its first update
            for (bool offload : offloads) {
                if (r.optimizer == "prodigy" && offload) continue;  // its state stays whole
                r.blocks_to_swap = swap;
                r.offload_optimizer = offload;
                out.push_back(r);
            }
        }
    };
    for (const auto& precision : precisions)
        for (int64_t ckpt : checkpointing)
            for (const auto& attention : attentions)
                for (int64_t rows_per_chunk : ff)
                    for (bool f : fused)
                        for (const auto& optimizer : optimizers)
                            for (int64_t accumulation : accumulations) {
                                PlanRemedies r = given;
                                r.mixed_precision = precision;
                                r.gradient_checkpointing = ckpt;
                                r.attention = attention;
                                r.ff_chunk_size = rows_per_chunk;
                                r.fused_backward = f;
                                r.optimizer = optimizer;
                                r.accumulation = accumulation;
                                add(r);
                            }
    return out;
}

}  // namespace

SearchResult search_remedies(const PlanShape& shape, const PlanRemedies& given,
                             const std::set<std::string>& vary, int64_t budget,
                             CalibrationStore& store) {
    const auto& known = searchable_remedies();
    for (const std::string& name : vary) {
        if (std::find(known.begin(), known.end(), name) == known.end()) {
            throw Error::InvalidArgument(
                fmt::format("--search: {} is not one of {}", name, fmt::join(known, ", ")));
        }
    }
    const ParameterCensus census = count_parameters(shape);
    SearchResult result;
    for (const PlanRemedies& r : combinations(shape, given, vary)) {
        ++result.tried;
        Footprint f = predict_footprint(shape, r, census, store.phases(shape, r));
        if (f.peak > budget) continue;
        result.fitting.push_back({r, std::move(f), store.relative_time(shape, r)});
    }
    // What stays on the device first: the host's copies cost transfers the calibration does not
    // measure (its device is the host on a CPU). Then costs within 5% count as equal: then fewer
    // micro-batches, then less in host memory, then the lower peak.
    std::sort(result.fitting.begin(), result.fitting.end(),
              [](const Candidate& a, const Candidate& b) {
                  const bool ha = a.footprint.host > 0, hb = b.footprint.host > 0;
                  if (ha != hb) return hb;
                  const double ca = std::round(a.cost * 20), cb = std::round(b.cost * 20);
                  if (ca != cb) return ca < cb;
                  if (a.remedies.accumulation != b.remedies.accumulation)
                      return a.remedies.accumulation < b.remedies.accumulation;
                  if (a.footprint.host != b.footprint.host)
                      return a.footprint.host < b.footprint.host;
                  return a.footprint.peak < b.footprint.peak;
              });
    return result;
}

}  // namespace sf::plan
