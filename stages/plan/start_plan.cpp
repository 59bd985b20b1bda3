#include "stages/plan/start_plan.h"

#include "stages/train/auto_fit.h"

namespace sf::plan {

PlanRemedies remedies_of(const train::TrainStepOptions& o, const std::string& optimizer,
                         bool offload_optimizer) {
    PlanRemedies r;
    r.mixed_precision = o.mixed_precision == "fp16" ? "bf16" : o.mixed_precision;
    r.gradient_checkpointing = o.gradient_checkpointing;
    r.attention = o.attention;
    r.attention_chunk = o.attention_chunk;
    r.ff_chunk_size = o.ff_chunk_size;
    r.fused_backward = o.fused_backward;
    r.accumulation = o.accumulation;
    r.micro_batch_split = o.micro_batch_split;
    r.optimizer = optimizer;
    r.blocks_to_swap = o.blocks_to_swap;
    r.offload_optimizer = offload_optimizer;
    return r;
}

train::TrainStepOptions step_options_of(const PlanRemedies& r) {
    train::TrainStepOptions o;
    o.mark_steps = 0;
    o.mixed_precision = r.mixed_precision;
    o.gradient_checkpointing = r.gradient_checkpointing;
    o.attention = r.attention;
    o.attention_chunk = r.attention_chunk;
    o.ff_chunk_size = r.ff_chunk_size;
    o.accumulation = r.accumulation;
    o.micro_batch_split = r.micro_batch_split;
    o.fused_backward = r.fused_backward;
    o.blocks_to_swap = r.blocks_to_swap;
    o.max_grad_norm = r.fused_backward ? 0.0 : 1.0;
    return o;
}

StartPlan plan_start(const PlanShape& shape, int64_t micro_batch, train::TrainStepOptions o,
                     const std::string& optimizer, bool offload_optimizer, int64_t budget,
                     CalibrationStore& store) {
    const ParameterCensus census = count_parameters(shape);
    StartPlan plan;
    for (;;) {
        const PlanRemedies r = remedies_of(o, optimizer, offload_optimizer);
        plan.predicted = predict_footprint(shape, r, census, store.phases(shape, r));
        plan.options = o;
        plan.fits =
            static_cast<double>(plan.predicted.peak) * kStartMargin <= static_cast<double>(budget);
        if (plan.fits) return plan;
        const auto change = train::relieve(o, micro_batch, shape.video.has_value());
        if (!change) return plan;
        plan.changes.push_back(*change);
    }
}

}  // namespace sf::plan
