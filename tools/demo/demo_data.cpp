#include "tools/demo/demo_data.h"

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <vector>

#include "core/error.h"

namespace sf::tools {
namespace fs = std::filesystem;
namespace {

struct Shape {
    const char* name;
    int kind;  // 0 circle, 1 square, 2 triangle
};

struct Color {
    const char* name;
    cv::Scalar bgr;
};

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) throw Error::IOError("cannot write " + path.string());
}

}  // namespace

DemoDataStats write_demo_dataset(const std::string& dir, int count, unsigned seed) {
    static const Shape kShapes[] = {{"circle", 0}, {"square", 1}, {"triangle", 2}};
    static const Color kColors[] = {{"red", {40, 40, 220}},     {"green", {60, 180, 60}},
                                    {"blue", {200, 90, 30}},    {"yellow", {40, 210, 230}},
                                    {"white", {245, 245, 245}}, {"black", {20, 20, 20}}};
    // (height, width): square, portrait and landscape, so several buckets are used.
    static const int kSizes[][2] = {{512, 512}, {640, 480}, {480, 640}, {384, 768}, {600, 400}};

    fs::create_directories(dir);
    std::mt19937 rng(seed);
    DemoDataStats stats;
    for (int i = 0; i < count; ++i) {
        const auto& shape = kShapes[rng() % 3];
        const auto& fg = kColors[rng() % 6];
        const Color* bg = &kColors[rng() % 6];
        while (bg == &fg) bg = &kColors[rng() % 6];
        const auto& size = kSizes[i % 5];
        const int h = size[0], w = size[1];
        cv::Mat img(h, w, CV_8UC3, bg->bgr);
        const cv::Point c(w / 4 + static_cast<int>(rng() % (w / 2)),
                          h / 4 + static_cast<int>(rng() % (h / 2)));
        const int r = std::min(h, w) / 6 + static_cast<int>(rng() % (std::min(h, w) / 6));
        if (shape.kind == 0) {
            cv::circle(img, c, r, fg.bgr, cv::FILLED, cv::LINE_AA);
        } else if (shape.kind == 1) {
            cv::rectangle(img, {c.x - r, c.y - r}, {c.x + r, c.y + r}, fg.bgr, cv::FILLED);
        } else {
            std::vector<cv::Point> tri = {{c.x, c.y - r}, {c.x - r, c.y + r}, {c.x + r, c.y + r}};
            cv::fillConvexPoly(img, tri, fg.bgr, cv::LINE_AA);
        }
        const std::string stem = fs::path(dir) / ("img_" + std::to_string(1000 + i));
        const bool png = i % 4 == 3;
        if (!cv::imwrite(stem + (png ? ".png" : ".jpg"), img)) {
            throw Error::IOError("cannot write " + stem);
        }
        write_text(stem + ".txt", std::string("a ") + fg.name + " " + shape.name + " on a " +
                                      bg->name + " background");
        ++stats.images;
    }
    // A truncated JPEG and an image below the minimum side: the prep run rejects both, by name.
    std::vector<uchar> jpeg;
    cv::imencode(".jpg", cv::Mat(256, 256, CV_8UC3, cv::Scalar(10, 120, 200)), jpeg);
    write_text(fs::path(dir) / "broken_truncated.jpg",
               std::string(reinterpret_cast<const char*>(jpeg.data()), jpeg.size() / 2));
    write_text(fs::path(dir) / "broken_truncated.txt", "a truncated file");
    cv::imwrite((fs::path(dir) / "tiny_thumbnail.png").string(),
                cv::Mat(32, 32, CV_8UC3, cv::Scalar(0, 0, 0)));
    write_text(fs::path(dir) / "tiny_thumbnail.txt", "a tiny thumbnail");
    stats.bad_files = 2;
    return stats;
}

}  // namespace sf::tools
