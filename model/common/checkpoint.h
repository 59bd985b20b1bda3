// Gradient checkpointing, as PyTorch's reentrant torch.utils.checkpoint: the forward keeps only a
// function's inputs, not its activations, and backward runs the function again to get them.
// Memory for activations drops from all blocks to one block, for about one more forward.
//
//   at::Tensor y = checkpoint(
//       [block](const std::vector<at::Tensor>& in) { return block(in[0], in[1]); }, {x, ctx});
//
// The recompute sees what the forward saw: the CPU generator (and the CUDA generator of every
// CUDA device among the inputs) is put back to its state at the forward, so dropout draws the
// same mask, and the caller's generator state is restored after; the autocast state is the
// forward's too. Parameters used inside `fn` get their gradients through a nested backward, so
// they are accumulated by their AccumulateGrad nodes and any post hooks on those (a fused
// optimizer step, the data-parallel sync) run as they would without checkpointing, once per
// backward pass as long as each parameter is used by one checkpointed call.
//
// A function checkpointed in pieces (chunks of tokens, rows or frames of one module) uses its
// parameters in every piece: those calls pass them as `params`, and each piece returns their
// gradients to the engine instead of accumulating them, so the pieces' shares meet in the
// accumulator, which runs once, as without chunking.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace sf::model {

// A pure function of its inputs and of module parameters (captured, not passed): it is run
// twice, so it must not change state other than by drawing random numbers.
using CheckpointFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;
// Called before each run of fn (the forward and the recompute); what it returns is held until
// the run's results are no longer needed: after the forward, after the recompute's backward.
// Block swap lends a block's weights to the device this way (model/common/block_swap.h).
using CheckpointScope = std::function<std::shared_ptr<void>()>;

// Returns fn(inputs). In grad mode the result's backward recomputes fn with grad and returns the
// gradients of the inputs that require grad; undefined inputs are passed through as undefined.
// Parameters inside `fn` get gradients even when no input requires grad (a frozen embedder in
// front of trained blocks), unlike PyTorch's reentrant form. Nothing is saved outside grad mode.
// `fn` and the modules it captures must outlive the backward. Not for create_graph (double
// backward), as upstream's reentrant form.
//
// `params`: the parameters fn uses that require grad (params_requiring_grad of its module). When
// given, the recompute's backward returns their gradients (and the inputs') from this node
// instead of accumulating them in a nested backward; a parameter fn uses that is not among them
// then gets no gradient. Under block swap's scope, the parameters of that scope's block must not
// be passed (they are lent anew for the recompute).
at::Tensor checkpoint(CheckpointFn fn, at::TensorList inputs, CheckpointScope scope = {},
                      at::TensorList params = {});

// `module`'s parameters that require grad, in order: what checkpoint's `params` takes for a
// function of that module.
std::vector<at::Tensor> params_requiring_grad(const torch::nn::Module& module);

}  // namespace sf::model
