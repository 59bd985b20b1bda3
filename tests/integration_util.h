// Shared by the integration tests: generated datasets and the program's path.
#pragma once

#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>

#include "pipelines/prep/prep.h"
#include "test_util.h"

namespace sf::test {

inline const std::string kSanaflow = std::string(SANAFLOW_BINARY_DIR) + "/sanaflow";

// Writes image i of a dataset: sizes and colors vary so several buckets are used.
inline void write_image(const std::filesystem::path& dir, int i, const std::string& caption) {
    const int sizes[][2] = {{300, 300}, {320, 240}, {240, 320}, {200, 400}};
    const auto& s = sizes[i % 4];
    cv::Mat img(s[0], s[1], CV_8UC3, cv::Scalar(i * 7 % 255, i * 13 % 255, i * 29 % 255));
    cv::circle(img, {s[1] / 2, s[0] / 2}, 40 + i % 50, cv::Scalar(255 - i % 255, 80, 20),
               cv::FILLED);
    const std::string stem = (dir / ("img_" + std::to_string(i))).string();
    ASSERT_TRUE(cv::imwrite(stem + (i % 3 == 0 ? ".png" : ".jpg"), img));
    write_file(stem + ".txt", caption);
}

inline void write_dataset(const std::filesystem::path& dir, int first, int count) {
    std::filesystem::create_directories(dir);
    for (int i = first; i < first + count; ++i)
        write_image(dir, i, "picture number " + std::to_string(i));
}

inline sf::pipelines::PrepOptions options_for(const TempDir& tmp) {
    sf::pipelines::PrepOptions o;
    o.instance_data_dir = tmp.file("data");
    o.cache_dir = tmp.file("cache");
    o.resolution = 512;
    o.min_side = 128;
    o.commit_batch = 4;
    return o;
}

}  // namespace sf::test
