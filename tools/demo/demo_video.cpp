#include "tools/demo/demo_video.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "stages/video/clip_writer.h"

namespace sf::tools {
namespace {

void write_clip(const std::string& path, int frames, unsigned seed) {
    constexpr int kWidth = 64, kHeight = 48, kFps = 8;
    stages::ClipWriter clip(path, kWidth, kHeight, kFps);
    for (int i = 0; i < frames; ++i) {
        clip.push_yuv([&](uint8_t* const* planes, const int* linesizes) {
            // A diagonal gradient sliding by 3 pixels a frame, tinted per clip.
            for (int y = 0; y < kHeight; ++y) {
                for (int x = 0; x < kWidth; ++x) {
                    planes[0][y * linesizes[0] + x] =
                        static_cast<uint8_t>((x + y + 3 * i + seed * 37) % 220 + 16);
                }
            }
            for (int y = 0; y < kHeight / 2; ++y) {
                for (int x = 0; x < kWidth / 2; ++x) {
                    planes[1][y * linesizes[1] + x] = static_cast<uint8_t>(64 + seed * 29 % 128);
                    planes[2][y * linesizes[2] + x] = static_cast<uint8_t>(192 - 2 * i % 128);
                }
            }
        });
    }
    clip.finish();
}

}  // namespace

void write_demo_clips(const std::string& dir, int count, int frames, unsigned seed) {
    std::filesystem::create_directories(dir);
    for (int i = 0; i < count; ++i) {
        const std::string stem = fmt::format("{}/clip_{}", dir, i);
        write_clip(stem + ".avi", frames, seed + static_cast<unsigned>(i));
        std::ofstream(stem + ".txt") << "a sliding gradient, clip number " << i << "\n";
    }
}

}  // namespace sf::tools
