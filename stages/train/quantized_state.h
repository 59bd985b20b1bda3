// Optimizer state in 8 bits, as bitsandbytes' blockwise 8-bit optimizers keep it: the tensor cut
// into blocks of kQuantBlock values, each stored as one byte per value (the index of the nearest
// entry of a 256-value "dynamic" map: a decimal exponent and a fraction, dense near zero) times
// the block's largest magnitude (absmax, fp32). Signed for AdamW's first moment, unsigned for the
// second (whose values are never negative, so all 256 codes go to magnitudes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace sf::train {

constexpr int64_t kQuantBlock = 2048;
// Tensors smaller than this keep fp32 state, as bitsandbytes' min_8bit_size: biases and norms
// weigh nothing, and their moments are the ones a block's absmax would crush.
constexpr int64_t kMin8BitSize = 4096;

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits 7, total_bits 8): 256 sorted fp32
// values in [-1, 1] (signed) or [0, 1].
at::Tensor dynamic_map(bool is_signed);

struct BlockQuantized {
    at::Tensor codes;   // [numel] uint8
    at::Tensor absmax;  // [ceil(numel / kQuantBlock)] fp32
    bool is_signed = true;

    bool defined() const { return codes.defined(); }
    // Any float tensor -> its codes (nearest map entry of value / block absmax; an all-zero
    // block stores zeros).
    static BlockQuantized quantize(const at::Tensor& values, bool is_signed);
    // -> fp32 values, shaped like `like`, on its device.
    at::Tensor dequantize(const at::Tensor& like) const;
};

}  // namespace sf::train
