// Files that must survive a crash are never written in place: they are written to a temporary
// file in the same directory, fsynced, renamed over the target and the directory fsynced, so a
// reader sees either the old file or the new one, never half of either.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sf::storage {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
    UniqueFd& operator=(UniqueFd&& other) noexcept;
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    int release();
    void reset(int fd = -1);

private:
    int fd_ = -1;
};

// Writes `path` atomically, in pieces. Nothing is visible at `path` until commit(); destroying an
// uncommitted writer removes the temporary file. Errors are sf::Error kIOError naming the path.
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(std::string path);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(std::string_view bytes);
    // fsync the data, rename over the target, fsync the directory.
    void commit();

    const std::string& path() const { return path_; }

private:
    std::string path_;
    std::string temp_path_;
    UniqueFd fd_;
    bool committed_ = false;
};

void write_file_atomic(const std::string& path, std::string_view bytes);

// Whole file into memory; kNotFound if it does not exist, kIOError on other failures.
std::string read_file(const std::string& path);

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; `what` names the file in errors.
void write_all(int fd, std::string_view bytes, const std::string& what);

// "disk full: <doing>: <free> free, at least <needed> needed (make room and rerun: ...)", the one
// wording of a full disk (`free` and `needed` left out when unknown or 0).
std::string disk_full_message(const std::string& doing, std::optional<uint64_t> free,
                              uint64_t needed);

// fsync the directory that holds `path`, so that a rename or a creation inside it is durable.
void fsync_parent_dir(const std::string& path);

}  // namespace sf::storage
