// The schedule diffusers' multistep flow solvers share (DPMSolverMultistepScheduler and
// UniPCMultistepScheduler with use_flow_sigmas and final_sigmas_type "zero"):
//
//   sigmas     steps values: 1 - linspace(1, 1/N, steps + 1), shifted s -> shift s / (1 + (shift
//              - 1) s), reversed, the last (0) dropped; then a trailing 0. Stored as float32, as
//              upstream stores them
//   timesteps  the model sees int64(sigma * N) of the float64 sigmas (upstream truncates them)
//   lambda     log(1 - sigma) - log(sigma): the solvers step in it
//
// Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace sf::sample {

struct FlowSchedule {
    std::vector<double> sigmas;      // steps + 1, descending to the trailing 0
    std::vector<int64_t> timesteps;  // steps: what the model is given
};

// kInvalidArgument for steps outside [1, 10000] or a shift that is not a finite positive number.
FlowSchedule flow_schedule(int64_t steps, double shift, int64_t num_train_timesteps = 1000);

// log(1 - sigma) - log(sigma); +infinity at sigma 0.
double flow_lambda(double sigma);

}  // namespace sf::sample
