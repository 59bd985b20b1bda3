// Which sampler draws validation and class images, and with what settings: diffusers'
// DPMSolverMultistepScheduler as Sana's pipelines configure it (stages/sample/dpm_solver.h),
// UniPCMultistepScheduler on flow sigmas (stages/sample/unipc.h) or
// FlowMatchEulerDiscreteScheduler (stages/sample/flow_sampler.h). A diffusers model root's
// scheduler/scheduler_config.json names one of the three; a setting that none runs as upstream
// would is refused, naming the file and key, rather than sampled otherwise. Torch-free (fuzzed by
// tools/fuzz/fuzz_config.cpp); flow_sampler.h samples with a spec.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sf::sample {

struct SamplerSpec {
    enum class Kind { kDpmSolver, kUniPc, kEuler };
    Kind kind = Kind::kDpmSolver;
    double shift = 3.0;  // flow_shift (DPM-Solver, UniPC) or shift (Euler)
    int64_t num_train_timesteps = 1000;
    int solver_order = 2;                    // DPM-Solver++: 1 or 2; UniPC: 1 to 3
    bool heun = false;                       // DPM-Solver++'s solver_type "heun" ("midpoint" else)
    std::vector<int64_t> disable_corrector;  // UniPC's steps without a correction
    std::string config_file;                 // the scheduler_config.json read; "": none
};

// "DPM-Solver++ 2M (shift 3)", "UniPC order 2 (shift 3)" or "Euler (shift 3)", for the log, with
// ", from FILE" inside the brackets when a config file was read.
std::string describe(const SamplerSpec& spec);

// A scheduler_config.json of DPMSolverMultistepScheduler (dpmsolver++ on flow sigmas with flow
// predictions, order 1 or 2, final sigma 0, no thresholding), of UniPCMultistepScheduler (the
// same, predicting x0 with "bh2", order 1 to 3, lower_order_final, no solver_p) or of
// FlowMatchEulerDiscreteScheduler (static shift, no other sigma spacing, no stochastic sampling).
// Absent keys take diffusers' defaults. kInvalidArgument naming the file and the key (or class) it
// cannot run; kNotFound for a missing file.
SamplerSpec read_scheduler_config(const std::string& path);
// The same from a parsed config object; `where` names it in messages.
SamplerSpec scheduler_from_config(const nlohmann::json& config, const std::string& where);

// kInvalidArgument unless `steps` and the spec's shift can be sampled.
void check_sampler(const SamplerSpec& spec, int64_t steps);

}  // namespace sf::sample
