// A 1x1 convolution computed as the matrix product it is: the pixels of x [B, C, h, w] are the
// rows, the channels the columns, and the conv's weight [C', C, 1, 1] the matrix. Sana's Mix-FFN
// feeds its 1x1 convs a channels-last view of the tokens ([B, h * w, D] permuted), which the
// product reads without a copy; oneDNN's convolution reorders it instead, and on CPUs with AMX its
// backward takes scratchpads of a megabyte whose size follows no term of the planner's memory
// model (stages/plan/memory_model.h). The weights keep upstream's Conv2d names and shapes.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/conv.h>

namespace sf::model {

// A 1x1 conv's weight [C', C, 1, 1] (and bias [C'] or undefined) applied to x [B, C, h, w] ->
// [B, C', h, w], a channels-last view.
inline at::Tensor pointwise_conv(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias) {
    const at::Tensor pixels = x.permute({0, 2, 3, 1});  // [B, h, w, C]
    return at::linear(pixels, weight.flatten(1), bias).permute({0, 3, 1, 2});
}

// conv (1x1, stride 1, no groups) of x [B, C, h, w] -> [B, C', h, w], a channels-last view.
inline at::Tensor pointwise_conv(const torch::nn::Conv2d& conv, const at::Tensor& x) {
    return pointwise_conv(x, conv->weight, conv->options.bias() ? conv->bias : at::Tensor());
}

}  // namespace sf::model
