// The search of `sanaflow plan --memory_budget`: every combination of the remedies it may vary
// (precision, checkpointing, micro-batches at the same effective batch, attention kind, chunked
// feed-forward, fused backward, 8-bit moments, block swap, optimizer offload) predicted by the
// calibrated memory model; those within the budget ordered by their measured step-time cost,
// the ones that keep everything on the device first.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "stages/plan/calibration.h"
#include "stages/plan/memory_model.h"

namespace sf::plan {

// What a search may vary, by name (--search): all of them by default.
const std::vector<std::string>& searchable_remedies();

struct Candidate {
    PlanRemedies remedies;
    Footprint footprint;
    double cost = 1;  // step time over no remedies', measured on the calibration's steps
};

struct SearchResult {
    std::vector<Candidate> fitting;  // cheapest first; equal costs: fewer micro-batches first
    int64_t tried = 0;
};

// kInvalidArgument for a name in `vary` that searchable_remedies() does not list.
SearchResult search_remedies(const PlanShape& shape, const PlanRemedies& given,
                             const std::set<std::string>& vary, int64_t budget,
                             CalibrationStore& store);

}  // namespace sf::plan
