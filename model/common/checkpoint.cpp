#include "model/common/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/common/autocast.h"

namespace sf::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor cpu_rng_state() {
    at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
    at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
}

// Random-number state of the CPU and of each CUDA device involved.
struct RngState {
    at::Tensor cpu;
    std::vector<std::pair<int, at::Tensor>> cuda;  // device index, state

    static RngState capture(const std::vector<int>& cuda_devices) {
        RngState s;
        s.cpu = cpu_rng_state();
        for (int d : cuda_devices) s.cuda.emplace_back(d, compat::cuda_rng_state(d));
        return s;
    }
    void restore() const {
        set_cpu_rng_state(cpu);
        for (const auto& [d, state] : cuda) compat::set_cuda_rng_state(d, state);
    }
};

// The CUDA devices of the inputs, as upstream's get_device_states: a function's random draws on
// other devices are not reproduced.
std::vector<int> cuda_devices_of(at::TensorList inputs) {
    std::vector<int> devices;
    if (!compat::cuda_is_available()) return devices;
    for (const at::Tensor& t : inputs) {
        if (t.defined() && t.is_cuda()) devices.push_back(t.get_device());
    }
    std::sort(devices.begin(), devices.end());
    devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
    return devices;
}

// Puts the forward's generator state in place for the recompute and the caller's back after,
// so that checkpointing does not change the random numbers drawn after the backward.
class RngFork {
public:
    explicit RngFork(const RngState& forward) : caller_(RngState::capture(devices(forward))) {
        forward.restore();
    }
    ~RngFork() { caller_.restore(); }
    RngFork(const RngFork&) = delete;
    RngFork& operator=(const RngFork&) = delete;

private:
    static std::vector<int> devices(const RngState& s) {
        std::vector<int> out;
        for (const auto& entry : s.cuda) out.push_back(entry.first);
        return out;
    }
    RngState caller_;
};

// fn's arguments: `present` in order, with undefined tensors where `defined` says so.
std::vector<at::Tensor> with_undefined(const std::vector<bool>& defined, at::TensorList present) {
    std::vector<at::Tensor> all;
    all.reserve(defined.size());
    size_t next = 0;
    for (bool d : defined) all.push_back(d ? present[next++] : at::Tensor());
    return all;
}

// What the backward needs besides the saved inputs. Held in the context as a capsule, since
// saved_data takes IValues and a std::function is none.
struct CheckpointState : torch::CustomClassHolder {
    CheckpointFn fn;
    // Per argument of fn: defined or not. Only the defined ones pass through the autograd
    // Function, whose input bookkeeping (VariableInfo) refuses undefined tensors.
    std::vector<bool> defined;
    std::vector<bool> requires_grad;  // per defined input, as at the forward
    RngState rng;
    AutocastState autocast;
    CheckpointScope scope;  // may be empty
    // Parameters whose gradients the backward returns (checkpoint's `params`).
    std::vector<at::Tensor> params;
};

std::shared_ptr<void> enter(const CheckpointScope& scope) {
    return scope ? scope() : std::shared_ptr<void>();
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
    // `inputs` are fn's defined arguments, `defined` says where they go among all of them.
    // `anchor` is a leaf that requires grad when no input does, so that this node exists and
    // parameters inside fn still get gradients.
    static at::Tensor forward(AutogradContext* ctx, CheckpointFn fn, CheckpointScope scope,
                              std::vector<bool> defined, at::TensorList inputs,
                              at::TensorList params, const c10::optional<at::Tensor>& anchor) {
        (void)anchor;
        auto state = c10::make_intrusive<CheckpointState>();
        state->scope = std::move(scope);
        state->rng = RngState::capture(cuda_devices_of(inputs));
        state->autocast = AutocastState::capture();
        state->defined = std::move(defined);
        for (const at::Tensor& t : inputs) state->requires_grad.push_back(t.requires_grad());
        state->params = params.vec();
        at::Tensor out;
        {
            // Function::apply already runs forward without grad.
            CastCacheOff no_cache;  // (autocast.h)
            const auto held = enter(state->scope);
            out = fn(with_undefined(state->defined, inputs));
        }
        if (!out.defined()) {
            throw Error::InvalidArgument("checkpoint: the function returned an undefined tensor");
        }
        ctx->save_for_backward(inputs.vec());
        state->fn = std::move(fn);
        ctx->saved_data["state"] = at::IValue::make_capsule(std::move(state));
        return out;
    }

    // One slot per forward argument: fn, scope, defined, each input, each parameter, the anchor.
    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        const auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
            ctx->saved_data.at("state").toCapsule());
        const variable_list saved = ctx->get_saved_variables();
        // Detached copies are leaves of the recomputed graph, where the input gradients collect.
        std::vector<at::Tensor> inputs;
        inputs.reserve(saved.size());
        for (size_t i = 0; i < saved.size(); ++i) {
            inputs.push_back(saved[i].detach().requires_grad_(state->requires_grad[i]));
        }
        const auto held = enter(state->scope);  // until the nested backward is done
        at::Tensor out;
        {
            RngFork rng(state->rng);
            AutocastGuard autocast(state->autocast);
            torch::AutoGradMode grad(true);
            out = state->fn(with_undefined(state->defined, inputs));
        }
        variable_list grads(3);  // fn, scope, defined
        if (state->params.empty()) {
            // Nested (reentrant) backward: parameter gradients accumulate where they belong.
            if (out.requires_grad()) torch::autograd::backward({out}, {grad_outputs.at(0)});
            for (const at::Tensor& t : inputs) {
                grads.push_back(t.requires_grad() ? t.grad() : at::Tensor());
            }
        } else {
            // The parameters' gradients go out of this node with the inputs', so that the
            // pieces of one chunked function reach each accumulator together.
            std::vector<at::Tensor> targets;
            for (const at::Tensor& t : inputs) {
                if (t.requires_grad()) targets.push_back(t);
            }
            targets.insert(targets.end(), state->params.begin(), state->params.end());
            variable_list found(targets.size());
            if (out.requires_grad()) {
                found = torch::autograd::grad({out}, targets, {grad_outputs.at(0)},
                                              /*retain_graph=*/false, /*create_graph=*/false,
                                              /*allow_unused=*/true);
            }
            size_t next = 0;
            for (const at::Tensor& t : inputs) {
                grads.push_back(t.requires_grad() ? found[next++] : at::Tensor());
            }
            for (; next < found.size(); ++next) grads.push_back(found[next]);
        }
        grads.emplace_back();  // anchor
        return grads;
    }
};

}  // namespace

std::vector<at::Tensor> params_requiring_grad(const torch::nn::Module& module) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : module.parameters()) {
        if (p.requires_grad()) out.push_back(p);
    }
    return out;
}

at::Tensor checkpoint(CheckpointFn fn, at::TensorList inputs, CheckpointScope scope,
                      at::TensorList params) {
    if (!fn) throw Error::InvalidArgument("checkpoint: no function given");
    if (!at::GradMode::is_enabled()) {
        // Nothing will be recomputed: run it plainly and keep no state.
        const auto held = enter(scope);
        const at::Tensor out = fn(inputs.vec());
        if (!out.defined()) {
            throw Error::InvalidArgument("checkpoint: the function returned an undefined tensor");
        }
        return out;
    }
    std::vector<bool> defined;
    std::vector<at::Tensor> present;
    for (const at::Tensor& t : inputs) {
        defined.push_back(t.defined());
        if (t.defined()) present.push_back(t);
    }
    const bool any_requires_grad = std::any_of(
        present.begin(), present.end(), [](const at::Tensor& t) { return t.requires_grad(); });
    c10::optional<at::Tensor> anchor;
    if (!any_requires_grad && params.empty()) anchor = at::empty({0}).requires_grad_(true);
    return CheckpointFunction::apply(std::move(fn), std::move(scope), std::move(defined),
                                     at::TensorList(present), params, anchor);
}

}  // namespace sf::model
