#include "stages/train/quantized_state.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace sf::train {

namespace {

// Midpoints of `items` equal steps over [0.1, 1], scaled by 10^exponent.
void add_fractions(std::vector<float>& data, int64_t items, int exponent, bool is_signed) {
    const double scale = std::pow(10.0, exponent);
    for (int64_t j = 0; j + 1 < items; ++j) {
        const double lo = 0.1 + 0.9 * static_cast<double>(j) / static_cast<double>(items - 1);
        const double hi = 0.1 + 0.9 * static_cast<double>(j + 1) / static_cast<double>(items - 1);
        const double mean = (lo + hi) / 2;
        data.push_back(static_cast<float>(scale * mean));
        if (is_signed) data.push_back(static_cast<float>(-scale * mean));
    }
}

// [n] -> [blocks, kQuantBlock], zero-padded.
at::Tensor blocks_of(const at::Tensor& flat) {
    const int64_t n = flat.numel();
    const int64_t padded = (n + kQuantBlock - 1) / kQuantBlock * kQuantBlock;
    const at::Tensor full = padded == n ? flat : at::constant_pad_nd(flat, {0, padded - n}, 0);
    return full.view({-1, kQuantBlock});
}

}  // namespace

namespace {
at::Tensor build_dynamic_map(bool is_signed) {
    constexpr int kExponentBits = 7, kTotalBits = 8;
    const int non_sign_bits = kTotalBits - 1;
    const int64_t additional = (int64_t{1} << (non_sign_bits - kExponentBits)) - 1;
    std::vector<float> data;
    for (int i = 0; i < kExponentBits; ++i) {
        const int64_t items = is_signed
                                  ? (int64_t{1} << (i + non_sign_bits - kExponentBits)) + 1
                                  : (int64_t{1} << (i + non_sign_bits - kExponentBits + 1)) + 1;
        add_fractions(data, items, -(kExponentBits - 1) + i, is_signed);
    }
    if (additional > 0) add_fractions(data, additional + 1, 0, is_signed);
    data.push_back(0);
    data.push_back(1);
    SF_CHECK(data.size() <= 256, "the dynamic map has more than 256 values");
    data.resize(256, 0.0f);
    std::sort(data.begin(), data.end());
    return at::tensor(data, at::TensorOptions().dtype(at::kFloat));
}
}  // namespace

at::Tensor dynamic_map(bool is_signed) {
    static const at::Tensor maps[2] = {build_dynamic_map(false), build_dynamic_map(true)};
    return maps[is_signed ? 1 : 0];
}

BlockQuantized BlockQuantized::quantize(const at::Tensor& values, bool is_signed) {
    BlockQuantized q;
    q.is_signed = is_signed;
    const at::Tensor blocks = blocks_of(values.detach().reshape({-1}).to(at::kFloat));
    q.absmax = blocks.abs().amax(1);  // [blocks]
    const at::Tensor scale = q.absmax.clamp_min(1e-30).unsqueeze(1);
    const at::Tensor normed = (blocks / scale).clamp(-1, 1).reshape({-1});
    const at::Tensor map = dynamic_map(is_signed).to(values.device());
    // The nearest map entry: the insertion point or the one below it.
    const at::Tensor hi = at::searchsorted(map, normed).clamp(0, 255);
    const at::Tensor lo = (hi - 1).clamp(0, 255);
    const at::Tensor pick_lo =
        (normed - map.index_select(0, lo)).abs() <= (map.index_select(0, hi) - normed).abs();
    q.codes = at::where(pick_lo, lo, hi).narrow(0, 0, values.numel()).to(at::kByte);
    return q;
}

at::Tensor BlockQuantized::dequantize(const at::Tensor& like) const {
    const at::Tensor map = dynamic_map(is_signed).to(codes.device());
    at::Tensor values = blocks_of(map.index_select(0, codes.to(at::kLong)));
    values = values * absmax.unsqueeze(1);
    return values.reshape({-1}).narrow(0, 0, like.numel()).view(like.sizes()).to(like.device());
}

}  // namespace sf::train
