// One training pass of a module, as the kernel tests compare them: the plain ops against a
// memory-saving kernel, in fp32 and under bf16 autocast, by values, gradients and counted peak.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/memory.h"
#include "model/common/autocast.h"

namespace sf::test {

struct ModuleRun {
    at::Tensor out, grad_x;
    std::map<std::string, at::Tensor> grads;  // every parameter's, by name
    int64_t peak = 0;                         // counted CPU bytes above the start
};

// `forward(x)` on a copy of x0 that requires grad, then backward with output gradient g, under
// bf16 autocast when `bf16`. The parameters' gradients are taken and cleared.
inline ModuleRun run_module(torch::nn::Module& module,
                            const std::function<at::Tensor(const at::Tensor&)>& forward,
                            const at::Tensor& x0, const at::Tensor& g, bool bf16) {
    ModuleRun r;
    const at::Tensor x = x0.clone().requires_grad_(true);
    mem::reset_peak();
    const int64_t before = mem::cpu_stats().current;
    {
        model::AutocastGuard guard(at::kCPU, at::kBFloat16, bf16);
        r.out = forward(x);
        r.out.backward(g);
    }
    r.peak = mem::cpu_stats().peak - before;
    r.grad_x = x.grad();
    for (const auto& p : module.named_parameters()) {
        r.grads[p.key()] = p.value().grad().clone();
        p.value().mutable_grad() = at::Tensor();
    }
    return r;
}

// ||a - b|| / ||b||, a taken to fp32 first.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
    return ((a.to(at::kFloat) - b).norm() / b.norm()).item<double>();
}

}  // namespace sf::test
