#include "stages/train/train_step.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/check.h"
#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/shape.h"
#include "core/timeline.h"
#include "model/common/autocast.h"
#include "model/common/chunked_attention.h"
#include "stages/train/prodigy.h"

namespace sf::train {
namespace {

model::AttentionKernel attention_kernel(const std::string& name) {
    if (name == "dense") return model::AttentionKernel::kDense;
    if (name == "chunked") return model::AttentionKernel::kChunked;
    if (name == "fused") return model::AttentionKernel::kFused;
    throw Error::InvalidArgument(
        fmt::format("--attention must be dense, chunked or fused, got '{}'", name));
}

void validate(const TrainStepOptions& o) {
    resolve_dtype(o.mixed_precision);  // names --mixed_precision when bad
    attention_kernel(o.attention);
    if (o.gradient_checkpointing < 0)
        throw Error::InvalidArgument("--gradient_checkpointing must be >= 0");
    if (o.attention_chunk < 1) throw Error::InvalidArgument("--attention_chunk must be >= 1");
    if (o.accumulation < 1) {
        throw Error::InvalidArgument(
            fmt::format("--gradient_accumulation_steps must be >= 1, got {}", o.accumulation));
    }
    if (o.micro_batch_split < 1) {
        throw Error::InvalidArgument(
            fmt::format("--micro_batch_split must be >= 1, got {}", o.micro_batch_split));
    }
    if (o.max_grad_norm < 0) throw Error::InvalidArgument("--max_grad_norm must be >= 0");
    if (o.fused_backward && o.max_grad_norm > 0) {
        throw Error::InvalidArgument(
            "--fused_backward_pass updates each parameter before the other gradients exist, so it "
            "cannot clip by "
            "the global norm: drop --max_grad_norm (or set it to 0), or drop "
            "--fused_backward_pass");
    }
    if (o.fused_backward && o.loss_scaling) {
        throw Error::InvalidArgument(
            "--fused_backward_pass cannot skip a step after the fact, which fp16 loss scaling "
            "needs when a gradient "
            "overflows: use --mixed_precision bf16 (no loss scaling), or drop "
            "--fused_backward_pass");
    }
    if (o.blocks_to_swap < 0) throw Error::InvalidArgument("--blocks_to_swap must be >= 0");
    if (o.blocks_to_swap > 0 && o.fused_backward) {
        throw Error::InvalidArgument(
            "--blocks_to_swap with --fused_backward_pass: a swapped block's weights are on the "
            "device only while it runs, so they are updated after the backward pass, not inside "
            "it; drop one of them");
    }
    check_flow_matching(o.flow);
    check_chunk_starts(o.chunk_starts);
    if (!(o.i2v_probability >= 0 && o.i2v_probability <= 1)) {
        throw Error::InvalidArgument(fmt::format(
            "--i2v_probability must be a finite number in [0, 1], got {}", o.i2v_probability));
    }
}

}  // namespace

bool is_out_of_memory(const std::exception& e) {
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
    const auto* error = dynamic_cast<const Error*>(&e);
    return error != nullptr && error->code() == ErrorCode::kOutOfMemory;
}

RankShare rank_share(int64_t batch, int rank, int world_size) {
    RankShare s;
    s.first = batch * rank / world_size;
    s.count = batch * (rank + 1) / world_size - s.first;
    if (s.count == 0) {
        // Fewer samples than ranks (a bucket's last batch): this rank runs one sample at weight
        // 0, so its backward, and the collectives inside it, still happen.
        s.first = std::min<int64_t>(s.first, batch - 1);
        s.count = 1;
        s.weight = 0.0;
    }
    return s;
}

// A post hook on each parameter's gradient accumulator, which runs once the gradient of this
// backward pass is complete (accumulated): what PyTorch 2.1's register_post_accumulate_grad_hook
// does. LibTorch has no public API for it, so the hook goes on the accumulator node, which this
// object keeps alive (a variable holds its accumulator only weakly, and a new one would have no
// hook). An accumulator runs once per backward pass with every remedy: recomputed pieces of a
// block return their parameters' gradients to one node instead of accumulating them piece by
// piece (model/common/checkpoint.h).
class TrainStep::GradReadyHooks {
public:
    GradReadyHooks(const std::vector<at::Tensor>& params, std::function<void(size_t)> on_ready)
        : on_ready_(std::move(on_ready)) {
        for (size_t i = 0; i < params.size(); ++i) {
            auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
            SF_CHECK(accumulator != nullptr,
                     "a trainable parameter without a gradient accumulator");
            auto hook = std::make_unique<Hook>(this, i);
            hooks_.push_back(hook.get());
            accumulator->add_post_hook(std::move(hook));
            accumulators_.push_back(std::move(accumulator));
        }
    }
    ~GradReadyHooks() {
        // Other backward passes over these parameters must not call into a dead trainer.
        for (size_t i = 0; i < accumulators_.size(); ++i) {
            auto& hooks = accumulators_[i]->post_hooks();
            hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                                       [&](const auto& h) { return h.get() == hooks_[i]; }),
                        hooks.end());
        }
    }
    GradReadyHooks(const GradReadyHooks&) = delete;
    GradReadyHooks& operator=(const GradReadyHooks&) = delete;
    // Armed for the last backward pass of a step only; earlier ones accumulate as usual.
    void arm() { armed_ = true; }
    void disarm() { armed_ = false; }

private:
    struct Hook final : torch::autograd::FunctionPostHook {
        Hook(GradReadyHooks* owner, size_t index) : owner(owner), index(index) {}
        torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                                  const torch::autograd::variable_list&) override {
            if (owner->armed_) owner->on_ready_(index);
            return outputs;
        }
        GradReadyHooks* owner;
        size_t index;
    };
    std::function<void(size_t)> on_ready_;
    std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
    std::vector<Hook*> hooks_;
    bool armed_ = false;
};

// The fused backward pass: each parameter reduced across ranks, updated and its gradient freed
// as soon as the gradient is complete.
class TrainStep::FusedUpdate {
public:
    FusedUpdate(AdamW& adamw, GradientSync& sync)
        : adamw_(adamw), sync_(sync), hooks_(params_of(adamw), [this](size_t i) { apply(i); }) {}
    void arm(double lr) {
        lr_ = lr;
        applied_ = 0;
        hooks_.arm();
    }
    // After the backward: no more updates start, and the overlapped ones (--offload_optimizer)
    // are done; rethrows what one of them threw.
    void finish() {
        hooks_.disarm();
        adamw_.wait();
    }
    // After a failed backward: as finish(), but an update's own error gives way to the step's.
    void disarm() {
        hooks_.disarm();
        try {
            adamw_.wait();
        } catch (const std::exception& e) {
            log_warn("an optimizer update of the failed step failed too: {}", e.what());
        }
    }
    // Parameters updated since the last arm(): a step that failed after any cannot be retried.
    int64_t applied() const { return applied_; }

private:
    static std::vector<at::Tensor> params_of(const AdamW& adamw) {
        std::vector<at::Tensor> params;
        for (size_t i = 0; i < adamw.size(); ++i) params.push_back(adamw.param(i));
        return params;
    }
    void apply(size_t index) {
        sync_.reduce_one(index, adamw_.param(index));
        adamw_.step_one_overlapped(index, lr_);
        adamw_.drop_grad(index);
        ++applied_;
    }
    AdamW& adamw_;
    GradientSync& sync_;
    GradReadyHooks hooks_;
    double lr_ = 0;
    int64_t applied_ = 0;
};

AdamW& TrainStep::adamw() {
    if (adamw_ == nullptr)
        throw Error::InvalidArgument("this step updates with Prodigy, not AdamW");
    return *adamw_;
}

TrainStep::TrainStep(std::shared_ptr<model::DiffusionTransformer> model,
                     std::vector<std::pair<std::string, at::Tensor>> trainable, AdamWOptions adamw,
                     LRSchedule schedule, TrainStepOptions options, c10::Device device,
                     std::shared_ptr<GradientSync> sync)
    : model_(std::move(model)),
      sync_(sync ? std::move(sync) : std::make_shared<GradientSync>()),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      device_(device),
      scaler_(options_.loss_scaling) {
    validate(options_);
    autocast_dtype_ = resolve_dtype(options_.mixed_precision);
    if (autocast_dtype_ != at::kFloat) {
        try {  // refused now, naming the flag, rather than inside the first step
            model::AutocastGuard probe(device_.type(), autocast_dtype_, true);
        } catch (const Error& e) {
            throw Error::InvalidArgument(fmt::format(
                "--mixed_precision {} on {}: {}{}", options_.mixed_precision, device_.str(),
                e.what(), device_.is_cpu() ? " (use bf16 on the CPU)" : ""));
        }
    }
    if (trainable.empty())
        throw Error::InvalidArgument("nothing to train: no parameter requires a gradient");
    for (const auto& [name, p] : trainable) params_.push_back(p);
    if (adamw.prodigy.enabled) {
        if (options_.fused_backward || adamw.eight_bit || adamw.offload) {
            throw Error::InvalidArgument(
                "--optimizer prodigy sums over every gradient before its first update and keeps "
                "its fp32 state beside the weights: not with --fused_backward_pass, 8-bit state "
                "or --offload_optimizer");
        }
        auto prodigy = std::make_unique<Prodigy>(std::move(trainable), adamw);
        if (sync_->shards_state())
            prodigy->set_rank_sum([this](double v) { return sync_->reduce_sum(v); });
        optimizer_ = std::move(prodigy);
    } else {
        auto a = std::make_unique<AdamW>(std::move(trainable), adamw);
        adamw_ = a.get();
        optimizer_ = std::move(a);
    }
    optimizer_->set_owned(sync_->partition(params_));
    model_->set_blocks_to_swap(options_.blocks_to_swap, device_);
    apply_model_remedies();
    model_->module().train();
    if (options_.fused_backward) {
        fused_ = std::make_unique<FusedUpdate>(*adamw_, *sync_);
    } else if (sync_->reduces_during_backward() && options_.blocks_to_swap == 0) {
        // Not with block swap: a swapped block's gradients are complete on the device inside
        // its lend and move to the host only when it ends, so they are reduced after the
        // backward, from the host.
        sync_ready_ =
            std::make_unique<GradReadyHooks>(params_, [this](size_t i) { sync_->grad_ready(i); });
    }
}

TrainStep::~TrainStep() = default;

void TrainStep::apply_model_remedies() {
    model_->set_gradient_checkpointing(options_.gradient_checkpointing);
    model_->set_attention(attention_kernel(options_.attention), options_.attention_chunk);
    model_->set_feed_forward_chunk(options_.ff_chunk_size);
}

void TrainStep::adapt(const TrainStepOptions& o) {
    validate(o);
    SF_CHECK(
        o.mixed_precision == options_.mixed_precision && o.accumulation == options_.accumulation &&
            o.fused_backward == options_.fused_backward &&
            o.loss_scaling == options_.loss_scaling && o.blocks_to_swap == options_.blocks_to_swap,
        "adapt() changes only the split, checkpointing, attention and feed-forward chunks");
    options_.micro_batch_split = o.micro_batch_split;
    options_.gradient_checkpointing = o.gradient_checkpointing;
    options_.attention = o.attention;
    options_.attention_chunk = o.attention_chunk;
    options_.ff_chunk_size = o.ff_chunk_size;
    apply_model_remedies();
}

void TrainStep::begin_phase() {
    mem::reset_peak();
    phase_begin_ = mem::process_seconds();
}

void TrainStep::add_phase_peak(const std::string& phase, const PhasePeak& now) {
    PhasePeak& peak = peaks_[phase];
    peak.tensor_bytes = std::max(peak.tensor_bytes, now.tensor_bytes);
    peak.rss_bytes = std::max(peak.rss_bytes, now.rss_bytes);
}

void TrainStep::end_phase(const std::string& phase) {
    const bool cuda = device_.is_cuda();
    add_phase_peak(phase, {cuda ? mem::cuda_stats(device_.index() < 0 ? 0 : device_.index()).peak
                                : mem::cpu_stats().peak,
                           mem::peak_rss_bytes()});
    if (mem::timeline().recording()) {
        mem::timeline().add_span("train", fmt::format("step {} {}", step_ + 1, phase), phase_begin_,
                                 mem::process_seconds());
    }
    if (step_ < options_.mark_steps)
        mem::memory_log().mark("train", fmt::format("step {} {}", step_ + 1, phase));
}

std::string TrainStep::remedies_for(const std::string& phase) const {
    std::vector<std::string> flags;
    if (phase == "forward" || phase == "backward") {
        if (options_.gradient_checkpointing == 0) flags.push_back("--gradient_checkpointing");
        if (options_.mixed_precision == "no") flags.push_back("--mixed_precision bf16");
        if (options_.attention == "dense") flags.push_back("--attention chunked");
        flags.push_back("a smaller --train_batch_size with more --gradient_accumulation_steps");
    } else if (phase == "optimizer") {
        if (!options_.fused_backward) flags.push_back("--fused_backward_pass");
        flags.push_back("LoRA (--rank) instead of full fine-tuning");
    } else {
        flags.push_back("a smaller --train_batch_size with more --gradient_accumulation_steps");
    }
    return fmt::format("{}", fmt::join(flags, ", "));
}

void TrainStep::out_of_memory(const std::string& phase, const std::string& what) {
    // Nothing of the model or the optimizer changed unless AdamW ran: the optimizer phase, or
    // the fused pass updating parameters inside the backward.
    retryable_ = phase != "optimizer" && !(fused_ && fused_->applied() > 0);
    // Release what the failed step holds before reporting, so a caller that adapts can retry.
    optimizer_->zero_grad();
    if (fused_) fused_->disarm();
    if (sync_ready_) sync_ready_->disarm();
    mem::release_memory(fmt::format("train step {} after running out of memory", step_ + 1));
    throw Error::OutOfMemory(
        fmt::format("out of memory in the {} phase of step {}: {}. Flags that lower it: {}", phase,
                    step_ + 1, what, remedies_for(phase)));
}

FrameTimesteps TrainStep::frame_timesteps(const MicroBatch& mb, at::Generator& gen) const {
    FrameTimesteps frames;
    if (mb.latents.dim() != 5 || mb.latents.size(2) < 2) return frames;  // not a video window
    frames.chunk_starts = options_.chunk_starts;
    // Drawn only when asked, so runs without image-to-video draw what they always drew.
    if (options_.i2v_probability > 0) {
        const double draw =
            at::rand({1}, gen, at::TensorOptions().dtype(at::kDouble)).item<double>();
        frames.clean_first_frame = draw < options_.i2v_probability;
    }
    return frames;
}

StepResult TrainStep::step(const std::function<MicroBatch(int64_t k)>& load, at::Generator& gen) {
    const mem::Span span("train", fmt::format("step {}", step_ + 1));
    StepResult result;
    result.lr = schedule_.at(step_);
    std::string phase = "data";
    optimizer_->zero_grad();  // gradients a previous step kept (keep_gradients) must not accumulate
    try {
        at::Tensor loss_sum;  // read back once per step, not per micro-batch
        for (int64_t k = 0; k < options_.accumulation; ++k) {
            phase = "data";
            begin_phase();
            MicroBatch mb = load(k);
            if (mb.latents.dim() != model_->latent_rank()) {
                throw Error::InvalidArgument(fmt::format(
                    "{} takes latents of rank {} ([B, C, h, w] images or [B, C, f, h, w] video), "
                    "the batch has {}",
                    model_->class_name(), model_->latent_rank(), shape_string(mb.latents)));
            }
            mb.latents = mb.latents.to(device_, at::kFloat);
            mb.prompt_embeds = mb.prompt_embeds.to(device_, at::kFloat);
            if (mb.prompt_mask.defined()) mb.prompt_mask = mb.prompt_mask.to(device_);
            const NoisedBatch noised =
                flow_matching_noise(mb.latents, options_.flow, gen, frame_timesteps(mb, gen));
            end_phase(phase);
            forward_backward(mb, noised, k + 1 == options_.accumulation, result.lr, loss_sum,
                             phase);
        }
        result.loss =
            sync_->reduce_sum(loss_sum.item<double>()) / static_cast<double>(options_.accumulation);

        phase = "optimizer";
        begin_phase();
        update(result);
        end_phase(phase);
    } catch (const std::exception& e) {
        if (is_out_of_memory(e)) out_of_memory(phase, e.what());
        throw;
    }
    ++step_;
    result.step = step_;
    return result;
}

void TrainStep::forward_backward(MicroBatch& mb, const NoisedBatch& noised, bool last_micro_batch,
                                 double lr, at::Tensor& loss_sum, std::string& phase) {
    // The micro-batch as `split` passes over parts of this rank's share of it (samples and noise
    // drawn for the whole, as in step(), on every rank alike): each part's loss weighted by its
    // share of the samples, so the gradients of every part of every rank add up to the whole
    // micro-batch's.
    const bool autocast = autocast_dtype_ != at::kFloat;
    const int64_t batch = mb.latents.size(0);
    const RankShare mine = rank_share(batch, sync_->rank(), sync_->world_size());
    const int64_t split = std::min(options_.micro_batch_split, mine.count);
    for (int64_t j = 0, first = mine.first; j < split; ++j) {
        const int64_t count = (mine.first + mine.count - first) / (split - j);
        const bool whole = count == batch;
        auto part = [&](const at::Tensor& t) {
            return t.defined() && !whole ? t.narrow(0, first, count) : t;
        };
        const double share = mine.weight * static_cast<double>(count) / static_cast<double>(batch);
        phase = "forward";
        begin_phase();
        at::Tensor loss;
        {
            model::AutocastGuard guard(device_.type(), autocast ? autocast_dtype_ : at::kBFloat16,
                                       autocast);
            const at::Tensor prediction =
                model_->forward(part(noised.noisy), part(mb.prompt_embeds), part(noised.timesteps),
                                part(mb.prompt_mask));
            SF_CHECK(prediction.sizes() == part(noised.target).sizes(),
                     "the velocity's shape is not the latents'");
            loss = flow_matching_loss(prediction, part(noised.target), part(noised.frame_weights),
                                      part(noised.loss_weights), part(mb.sample_weights));
            if (!whole || mine.weight != 1.0) loss = loss * share;
        }
        loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
        if (j + 1 == split) mb = MicroBatch{};  // the inputs autograd does not hold go now
        end_phase(phase);

        phase = "backward";
        begin_phase();
        const bool last = last_micro_batch && j + 1 == split;
        if (fused_ && last) fused_->arm(lr);
        if (sync_ready_ && last) {
            sync_->begin_backward(params_);
            sync_ready_->arm();
        }
        scaler_.scale_loss(loss / static_cast<double>(options_.accumulation)).backward();
        if (fused_) fused_->finish();
        if (sync_ready_) sync_ready_->disarm();
        end_phase(phase);
        first += count;
    }
}

void TrainStep::update(StepResult& result) {
    if (fused_) {  // the updates are done: the fused pass made them in the backward
        sync_->share_updates(params_);
        return;
    }
    // The data-parallel point: every rank's gradients alike (ZeRO-1: each with its owner).
    sync_->reduce_all(params_);
    bool finite = scaler_.unscale(params_);
    const bool sharded = sync_->shards_state();
    if (sharded) finite = sync_->reduce_sum(finite ? 0.0 : 1.0) == 0.0;  // all agree
    if (finite && options_.max_grad_norm > 0) {
        result.grad_norm =
            clip_grad_norm(params_, options_.max_grad_norm,
                           sharded ? [this](double v) { return sync_->reduce_sum(v); }
                                   : std::function<double(double)>());
    }
    if (finite) {
        optimizer_->step(result.lr);
        if (const auto* prodigy = dynamic_cast<const Prodigy*>(optimizer_.get()))
            result.prodigy_d_lr = prodigy->d() * result.lr;
        sync_->share_updates(params_);
    }
    result.skipped = !finite;
    result.loss_scale = scaler_.scale();
    scaler_.update(!finite);
    if (!options_.keep_gradients) optimizer_->zero_grad();
}

std::string TrainStep::phase_table() const {
    std::string out = fmt::format("{:<10} {:>14} {:>14}\n", "phase", "peak tensors", "peak rss");
    for (const char* phase : {"data", "forward", "backward", "optimizer", "validation"}) {
        auto it = peaks_.find(phase);
        if (it == peaks_.end()) continue;
        out += fmt::format("{:<10} {:>14} {:>14}\n", phase, format_bytes(it->second.tensor_bytes),
                           format_bytes(it->second.rss_bytes));
    }
    return out;
}

}  // namespace sf::train
