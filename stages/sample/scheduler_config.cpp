#include "stages/sample/scheduler_config.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "model/common/config_json.h"
#include "stages/sample/flow_schedule.h"
#include "storage/json_text.h"

namespace sf::sample {
namespace {

// `key` must read as `want`; absent, it is diffusers' default `absent`.
void require_string(const model::ConfigReader& r, const char* key, const std::string& want,
                    const std::string& absent) {
    std::string value = absent;
    r.string(key, value);
    if (value != want)
        throw Error::InvalidArgument(
            fmt::format("{}: \"{}\" is \"{}\"; sanaflow samples only with \"{}\" here", r.where(),
                        key, storage::text_excerpt(value), want));
}

void require_bool(const model::ConfigReader& r, const char* key, bool want, bool absent = false) {
    bool value = absent;
    r.boolean(key, value);
    if (value != want)
        throw Error::InvalidArgument(fmt::format("{}: \"{}\" is {}; sanaflow samples only with {}",
                                                 r.where(), key, value, want));
}

void require_null(const model::ConfigReader& r, const char* key) {
    if (r.has_value(key))
        throw Error::InvalidArgument(
            fmt::format("{}: \"{}\" is set; sanaflow samples only without it", r.where(), key));
}

// What DPMSolverMultistepScheduler and UniPCMultistepScheduler share: flow sigmas ending at 0,
// flow predictions, no thresholding or other sigma spacing, an order in [1, most_order], their
// flow_shift (1.0 by default, as diffusers').
SamplerSpec read_multistep(const model::ConfigReader& r, SamplerSpec::Kind kind, int most_order,
                           const char* solver) {
    SamplerSpec spec;
    spec.kind = kind;
    spec.shift = 1.0;
    require_bool(r, "use_flow_sigmas", true);
    require_string(r, "prediction_type", "flow_prediction", "epsilon");
    require_string(r, "final_sigmas_type", "zero", "zero");
    for (const char* key : {"thresholding", "use_karras_sigmas", "use_exponential_sigmas",
                            "use_beta_sigmas", "use_dynamic_shifting"})
        require_bool(r, key, false);
    int64_t order = 2;
    r.integer("solver_order", order);
    if (order < 1 || order > most_order)
        throw Error::InvalidArgument(
            fmt::format("{}: \"solver_order\" is {}; sanaflow's {} runs orders 1 to {}", r.where(),
                        order, solver, most_order));
    spec.solver_order = static_cast<int>(order);
    r.number("flow_shift", spec.shift);
    r.integer("num_train_timesteps", spec.num_train_timesteps);
    return spec;
}

SamplerSpec read_dpm_solver(const model::ConfigReader& r) {
    SamplerSpec spec = read_multistep(r, SamplerSpec::Kind::kDpmSolver, 2, "DPM-Solver++");
    require_string(r, "algorithm_type", "dpmsolver++", "dpmsolver++");
    require_bool(r, "use_lu_lambdas", false);
    require_null(r, "variance_type");
    std::string solver_type = "midpoint";
    r.string("solver_type", solver_type);
    if (solver_type != "midpoint" && solver_type != "heun")
        throw Error::InvalidArgument(
            fmt::format("{}: \"solver_type\" is \"{}\"; it must be \"midpoint\" or \"heun\"",
                        r.where(), storage::text_excerpt(solver_type)));
    spec.heun = solver_type == "heun";
    return spec;
}

SamplerSpec read_unipc(const model::ConfigReader& r) {
    SamplerSpec spec = read_multistep(r, SamplerSpec::Kind::kUniPc, 3, "UniPC");
    require_bool(r, "predict_x0", true, true);
    // "bh1" (B(h) = hh) multiplies -infinity by 0 at the last step to sigma 0: NaN upstream.
    require_string(r, "solver_type", "bh2", "bh2");
    // Without it the last step divides by a ratio of 0 upstream (an order above 1 to sigma 0).
    require_bool(r, "lower_order_final", true, true);
    require_null(r, "solver_p");
    r.integer_list("disable_corrector", spec.disable_corrector);
    return spec;
}

SamplerSpec read_euler(const model::ConfigReader& r) {
    SamplerSpec spec;
    spec.kind = SamplerSpec::Kind::kEuler;
    spec.shift = 1.0;  // diffusers' default shift
    for (const char* key : {"use_dynamic_shifting", "use_karras_sigmas", "use_exponential_sigmas",
                            "use_beta_sigmas", "invert_sigmas", "stochastic_sampling"})
        require_bool(r, key, false);
    require_null(r, "shift_terminal");
    r.number("shift", spec.shift);
    r.integer("num_train_timesteps", spec.num_train_timesteps);
    return spec;
}

}  // namespace

std::string describe(const SamplerSpec& spec) {
    const std::string settings = fmt::format(
        "(shift {:g}{})", spec.shift, spec.config_file.empty() ? "" : ", from " + spec.config_file);
    if (spec.kind == SamplerSpec::Kind::kEuler) return "Euler " + settings;
    if (spec.kind == SamplerSpec::Kind::kUniPc)
        return fmt::format("UniPC order {} {}", spec.solver_order, settings);
    return fmt::format("DPM-Solver++ {}{} {}", spec.solver_order == 2 ? "2M" : "1",
                       spec.heun && spec.solver_order == 2 ? " heun" : "", settings);
}

SamplerSpec read_scheduler_config(const std::string& path) {
    const model::ConfigFile file = model::read_config_file(path, "scheduler config");
    SamplerSpec spec = scheduler_from_config(file.json, file.path);
    spec.config_file = file.path;
    return spec;
}

SamplerSpec scheduler_from_config(const nlohmann::json& config, const std::string& where) {
    const model::ConfigReader r(config, where);
    std::string name;
    r.string("_class_name", name);
    SamplerSpec spec;
    if (name == "DPMSolverMultistepScheduler") {
        spec = read_dpm_solver(r);
    } else if (name == "UniPCMultistepScheduler") {
        spec = read_unipc(r);
    } else if (name == "FlowMatchEulerDiscreteScheduler") {
        spec = read_euler(r);
    } else {
        throw Error::InvalidArgument(fmt::format(
            "{}: \"_class_name\" is \"{}\"; sanaflow samples with DPMSolverMultistepScheduler, "
            "UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler (--validation_scheduler "
            "dpm_solver, unipc or euler picks one without this file)",
            where, storage::text_excerpt(name)));
    }
    if (!std::isfinite(spec.shift) || spec.shift <= 0)
        throw Error::InvalidArgument(
            fmt::format("{}: the shift must be a finite number > 0, got {:g}", where, spec.shift));
    if (spec.num_train_timesteps < 1)
        throw Error::InvalidArgument(
            fmt::format("{}: \"num_train_timesteps\" must be >= 1", where));
    return spec;
}

void check_sampler(const SamplerSpec& spec, int64_t steps) {
    if (spec.kind == SamplerSpec::Kind::kEuler)
        euler_sigmas(steps, spec.shift, spec.num_train_timesteps);
    else
        flow_schedule(steps, spec.shift, spec.num_train_timesteps);
}

}  // namespace sf::sample
