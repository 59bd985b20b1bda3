// The clip reader (stages/video/clip_reader.cpp) over arbitrary bytes: probe (the limits, stream
// choice, display matrix, the end scan), then the first frames decoded and converted to the
// bucket through the source-cropping pointer arithmetic. libav itself is not instrumented; what
// is fuzzed is sanaflow's handling of what libav returns.
#include <algorithm>
#include <vector>

#include "fuzz_util.h"
#include "stages/video/clip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool quiet = [] {
        av_log_set_level(AV_LOG_QUIET);
        return true;
    }();
    (void)quiet;
    sf::stages::DecodeVideoConfig config;
    config.min_side = 1;
    // Keeps the decoders' own allocations inside the fuzzer's memory limit.
    config.max_pixels = 1 << 20;
    const std::string name = "clip";
    sf::fuzz::refused_or_read([&] {
        sf::stages::ClipReader probe(data, size, name, config, /*open_decoder=*/false);
        sf::stages::ClipReader reader(data, size, name, config, /*open_decoder=*/true);
        // The bucket at an eighth of its side, its aspect kept: the same cropping arithmetic at
        // a 64th of the scaling work (scaling to 512 x 512 took most of each execution).
        sf::stages::ClipInfo info = reader.info();
        info.bucket.height = std::max(info.bucket.height / 8, 2);
        info.bucket.width = std::max(info.bucket.width / 8, 2);
        sf::stages::FrameConverter converter(info, name);
        std::vector<uint8_t> rgb(3 * static_cast<size_t>(converter.stored_height()) *
                                 static_cast<size_t>(converter.stored_width()));
        for (int i = 0; i < 4 && reader.next() == sf::stages::ClipReader::Status::kFrame; ++i) {
            converter.convert(reader.frame(), rgb.data());
        }
    });
    return 0;
}
