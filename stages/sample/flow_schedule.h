// The sigmas and timesteps of diffusers' flow schedulers. Torch-free.
//
// FlowMatchEulerDiscreteScheduler (shift = its shift): steps values linspace(1, sigma_min, steps)
// with sigma_min the scheduler's own shifted 1/N, each shifted again, s -> shift s / (1 + (shift -
// 1) s) (upstream's set_timesteps shifts twice), then a trailing 0; the model sees sigma x N.
//
// The multistep solvers' (DPMSolverMultistepScheduler and UniPCMultistepScheduler with
// use_flow_sigmas and final_sigmas_type "zero"):
//
//   sigmas     steps values: 1 - linspace(1, 1/N, steps + 1), shifted s -> shift s / (1 + (shift
//              - 1) s), reversed, the last (0) dropped; then a trailing 0. Stored as float32, as
//              upstream stores them
//   timesteps  the model sees int64(sigma * N) of the float64 sigmas (upstream truncates them)
//   lambda     log(1 - sigma) - log(sigma): the solvers step in it
#pragma once

#include <cstdint>
#include <vector>

namespace sf::sample {

// Euler's steps + 1 sigmas, descending from 1 to the trailing 0. kInvalidArgument for steps
// outside [1, 10000] or a shift that is not a finite positive number.
std::vector<double> euler_sigmas(int64_t steps, double shift, int64_t num_train_timesteps = 1000);

struct FlowSchedule {
    std::vector<double> sigmas;      // steps + 1, descending to the trailing 0
    std::vector<int64_t> timesteps;  // steps: what the model is given
};

// The multistep solvers' schedule; kInvalidArgument as euler_sigmas.
FlowSchedule flow_schedule(int64_t steps, double shift, int64_t num_train_timesteps = 1000);

// log(1 - sigma) - log(sigma); +infinity at sigma 0.
double flow_lambda(double sigma);

}  // namespace sf::sample
