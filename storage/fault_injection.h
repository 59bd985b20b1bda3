// A seam at the file layer for tests, as leveldb's fault_injection_test has: the n-th write,
// fsync, rename or LMDB commit of a path can be made to fail with a chosen errno (ENOSPC, EIO,
// EINTR, ...), and the free space of a file system can be made to read as a chosen number, so
// every writer's failure path runs without filling a real disk. Unarmed (always, outside tests)
// a check is one atomic load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace sf::storage::faults {

enum class Op { kWrite, kFsync, kRename, kCommit };

struct Fault {
    Fault() = default;
    Fault(Op op_, int error_, std::string path_contains_ = "", int skip_ = 0, int times_ = 1)
        : op(op_),
          error(error_),
          path_contains(std::move(path_contains_)),
          skip(skip_),
          times(times_) {}

    Op op = Op::kWrite;
    int error = 0;              // the errno the call fails with
    std::string path_contains;  // only paths (or LMDB dirs) containing this; empty: any
    int skip = 0;               // matching calls let through first
    int times = 1;              // then this many fail; -1: every one after
};

// Replaces any armed fault; disarm() ends it. Thread-safe.
void arm(const Fault& fault);
void disarm();
// How many calls the armed fault has failed.
int fired();

// Called by the file layer before `op` on `path`: the errno to fail with, or 0.
int check(Op op, std::string_view path);

// Free bytes of the file system holding `path` (statvfs; the nearest existing parent), or the
// number set by set_free_bytes. nullopt when it cannot be read.
std::optional<uint64_t> free_bytes(const std::string& path);
void set_free_bytes(std::optional<uint64_t> bytes);

// Below this much free space an EIO from a write is reported as a full disk: LMDB and some file
// systems report a short write at the end of the space as EIO, not ENOSPC.
constexpr uint64_t kNearlyFullBytes = uint64_t{64} << 20;

// Arms a fault for a scope (and the free-space override, when given).
class ScopedFault {
public:
    explicit ScopedFault(const Fault& fault, std::optional<uint64_t> free = std::nullopt);
    ~ScopedFault();
    ScopedFault(const ScopedFault&) = delete;
    ScopedFault& operator=(const ScopedFault&) = delete;
};

}  // namespace sf::storage::faults
