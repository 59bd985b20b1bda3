// Upstream's tiled VAE passes (diffusers' blend_v / blend_h and the tile loop around them), shared
// by the autoencoders: tiles are encoded or decoded alone, then each is blended linearly with its
// upper and left neighbours over the overlap and cropped to the stride.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace sf::model {

// b's first `extent` rows along `dim` become a's last ones faded into b's (weight y / extent for
// b's row y), in place, as upstream computes it (scalar weights, row by row). extent is cut to
// both sizes.
void blend_tiles(const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim);

// Upstream's grid: tiles[i][j] (height and width the last two dimensions) blended with their upper
// and left neighbours in place, in row order, so a later tile blends with already blended
// neighbours as upstream's in-place loop does; each cropped to keep_h x keep_w; rows concatenated.
at::Tensor assemble_tiles(std::vector<std::vector<at::Tensor>>& tiles, int64_t blend_h,
                          int64_t blend_w, int64_t keep_h, int64_t keep_w);

}  // namespace sf::model
