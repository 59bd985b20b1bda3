#include "model/common/tile_blend.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace sf::model {

void blend_tiles(const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim) {
    extent = std::min({a.size(dim), b.size(dim), extent});
    for (int64_t y = 0; y < extent; ++y) {
        const double w = static_cast<double>(y) / static_cast<double>(extent);
        auto row = b.select(dim, y);
        row.copy_(a.select(dim, a.size(dim) - extent + y) * (1.0 - w) + row * w);
    }
}

at::Tensor assemble_tiles(std::vector<std::vector<at::Tensor>>& tiles, int64_t blend_h,
                          int64_t blend_w, int64_t keep_h, int64_t keep_w) {
    std::vector<at::Tensor> rows;
    for (size_t i = 0; i < tiles.size(); ++i) {
        std::vector<at::Tensor> row;
        for (size_t j = 0; j < tiles[i].size(); ++j) {
            auto& tile = tiles[i][j];
            const int64_t h = tile.dim() - 2, w = tile.dim() - 1;
            if (i > 0) blend_tiles(tiles[i - 1][j], tile, blend_h, h);
            if (j > 0) blend_tiles(tiles[i][j - 1], tile, blend_w, w);
            row.push_back(tile.slice(h, 0, keep_h).slice(w, 0, keep_w));  // [..., keep_h, keep_w]
        }
        rows.push_back(at::cat(row, -1));  // tiles side by side: [..., keep_h, W']
    }
    return at::cat(rows, -2);  // rows stacked: [..., H', W']
}

}  // namespace sf::model
