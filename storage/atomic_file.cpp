#include "storage/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <system_error>

#include "core/error.h"
#include "core/log.h"
#include "storage/fault_injection.h"

namespace sf::storage {
namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

// `needed`: bytes still to write, when known, for the disk-full message.
Error io_error(const std::string& what, const std::string& path, int err, uint64_t needed = 0) {
    if (err == ENOENT) return Error::NotFound(what + " " + path + ": " + errno_text(err));
    if (err == ENOSPC || err == EIO || err == EDQUOT) {
        const std::optional<uint64_t> free = faults::free_bytes(path);
        if (err != EIO || (free && *free < faults::kNearlyFullBytes))
            return Error::IOError(disk_full_message(what + " " + path, free, needed));
    }
    return Error::IOError(what + " " + path + ": " + errno_text(err));
}

std::string parent_dir(const std::string& path) {
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    return parent.empty() ? "." : parent.string();
}

// Unique within the process and across processes (pid), so concurrent writers of one target
// never share a temporary file; the last rename wins, which is all a reader can observe.
std::string temp_name_for(const std::string& path) {
    static std::atomic<unsigned> counter{0};
    return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
}

int UniqueFd::release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
}

void UniqueFd::reset(int fd) {
    // close() is not retried on EINTR: on Linux the descriptor is gone either way.
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

std::string disk_full_message(const std::string& doing, std::optional<uint64_t> free,
                              uint64_t needed) {
    std::string out = "disk full: " + doing;
    if (free) out += ": " + format_bytes(static_cast<int64_t>(*free)) + " free";
    if (needed > 0) out += ", at least " + format_bytes(static_cast<int64_t>(needed)) + " needed";
    return out + " (make room and rerun: what was written before is intact)";
}

void write_all(int fd, std::string_view bytes, const std::string& what) {
    while (!bytes.empty()) {
        ssize_t n = -1;
        if (const int injected = faults::check(faults::Op::kWrite, what)) {
            errno = injected;
        } else {
            n = ::write(fd, bytes.data(), bytes.size());
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            throw io_error("writing", what, errno, bytes.size());
        }
        bytes.remove_prefix(static_cast<size_t>(n));
    }
}

void fsync_parent_dir(const std::string& path) {
    std::string dir = parent_dir(path);
    UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) throw io_error("opening directory", dir, errno);
    if (const int injected = faults::check(faults::Op::kFsync, dir))
        throw io_error("fsync of directory", dir, injected);
    if (::fsync(fd.get()) != 0) throw io_error("fsync of directory", dir, errno);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(temp_name_for(path_)) {
    fd_.reset(::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd_) throw io_error("creating", temp_path_, errno);
}

AtomicFileWriter::~AtomicFileWriter() {
    if (committed_) return;
    fd_.reset();
    ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(std::string_view bytes) {
    if (committed_) throw Error::InvalidArgument("write after commit to " + path_);
    write_all(fd_.get(), bytes, temp_path_);
}

void AtomicFileWriter::commit() {
    if (committed_) return;
    if (const int injected = faults::check(faults::Op::kFsync, temp_path_))
        throw io_error("fsync of", temp_path_, injected);
    if (::fsync(fd_.get()) != 0) throw io_error("fsync of", temp_path_, errno);
    // close() can report a deferred write error (NFS); treat it as a failed write.
    if (::close(fd_.release()) != 0) throw io_error("closing", temp_path_, errno);
    if (const int injected = faults::check(faults::Op::kRename, path_))
        throw io_error("renaming onto", path_, injected);
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
        throw io_error("renaming onto", path_, errno);
    committed_ = true;
    fsync_parent_dir(path_);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFileWriter writer(path);
    writer.write(bytes);
    writer.commit();
}

std::string read_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw io_error("opening", path, errno);
    std::string out;
    char buffer[1 << 16];
    while (true) {
        ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw io_error("reading", path, errno);
        }
        if (n == 0) break;
        out.append(buffer, static_cast<size_t>(n));
    }
    return out;
}

}  // namespace sf::storage
