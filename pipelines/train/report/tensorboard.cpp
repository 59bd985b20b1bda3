#include "pipelines/train/report/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace sf::pipelines {
namespace {

// Protobuf's wire format, the few pieces an Event needs.
void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out += static_cast<char>((v & 0x7f) | 0x80);
        v >>= 7;
    }
    out += static_cast<char>(v);
}

template <class T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 and ARM store it
    char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.size());
    out += bytes;
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// An Event with its wall time and step; `body` holds its other fields.
std::string event(int64_t step, const std::string& body) {
    std::string e;
    put_varint(e, (1 << 3) | 1);  // wall_time, fixed64
    put_fixed(e, now_seconds());
    put_varint(e, 2 << 3);  // step, varint
    put_varint(e, static_cast<uint64_t>(step));
    return e + body;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected
            t[i] = c;
        }
        return t;
    }();
    uint32_t crc = 0xffffffffu;
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
    std::filesystem::create_directories(dir);
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}",
                                                      static_cast<int64_t>(now_seconds()), host,
                                                      ::getpid()))
                .string();
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr) {
        throw Error::IOError(fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
    }
    std::string version;
    put_bytes(version, 3, "brain.Event:2");
    write_record(event(0, version));
}

TensorBoardWriter::~TensorBoardWriter() {
    if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
        std::string v;
        put_bytes(v, 1, tag);
        put_varint(v, (2 << 3) | 5);  // simple_value, fixed32
        put_fixed(v, static_cast<float>(value));
        put_bytes(summary, 1, v);
    }
    std::string body;
    put_bytes(body, 5, summary);
    write_record(event(step, body));
}

void TensorBoardWriter::write_record(const std::string& data) {
    std::string record;
    const uint64_t length = data.size();
    put_fixed(record, length);
    put_fixed(record, masked(crc32c(record.data(), sizeof(length))));
    record += data;
    put_fixed(record, masked(crc32c(data.data(), data.size())));
    if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
        std::fflush(file_) != 0) {
        throw Error::IOError(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
    }
}

}  // namespace sf::pipelines
