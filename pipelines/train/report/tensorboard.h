// TensorBoard event files (`--report_to tensorboard`, upstream's default), written without
// TensorFlow: no maintained C++ writer is packaged, and the format is small and documented
// (tensorflow/core/lib/io/record_writer.cc, tensorflow/core/util/event.proto):
//
//   a file of records, each   uint64 length | uint32 masked CRC-32C of the length |
//                             data | uint32 masked CRC-32C of the data
//   masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8
//   data: an Event protobuf,  wall_time (1, double), step (2, int64), file_version (3, string,
//                             the first record: "brain.Event:2") or summary (5: Summary, whose
//                             repeated value (1) is a Value of tag (1, string) and
//                             simple_value (2, float))
//
// The file is OUTPUT_DIR/logs/sanaflow/events.out.tfevents.<seconds>.<host>.<pid>, one per run;
// each step's record is flushed as written. A resumed run writes a new file whose steps restart
// below the old file's last: TensorBoard then drops the old steps past the restart.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace sf::pipelines {

// CRC-32C (Castagnoli), as TFRecord files checksum their records.
uint32_t crc32c(const void* data, size_t size);

class TensorBoardWriter {
public:
    // Creates `dir` and a new event file in it.
    explicit TensorBoardWriter(const std::string& dir);
    ~TensorBoardWriter();
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

    // One Event at `step` holding a scalar per (tag, value).
    void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
    const std::string& path() const { return path_; }

private:
    void write_record(const std::string& event);

    std::string path_;
    std::FILE* file_ = nullptr;
};

}  // namespace sf::pipelines
