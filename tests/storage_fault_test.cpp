// Faults injected at the file layer (storage/fault_injection.h), as leveldb's fault_injection_test
// does: every writer, failing at each step with ENOSPC, EIO or EINTR, leaves the previous good
// state intact and says what happened, naming the path; a full disk is called one.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_writer.h"
#include "storage/fault_injection.h"
#include "storage/safetensors_file.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using faults::Fault;
using faults::Op;
using faults::ScopedFault;
using testing::error_code_of;
using testing::every_dtype_record;
using testing::pattern_tensor;
using testing::TempDir;

constexpr uint64_t kPlenty = uint64_t{100} << 30;

std::string message_of(const std::function<void()>& f) {
    std::string message;
    EXPECT_EQ(error_code_of(f, &message), ErrorCode::kIOError) << message;
    return message;
}

size_t files_in(const std::filesystem::path& dir) {
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) n += entry.is_regular_file();
    return n;
}

TEST(StorageFault, AtomicFileKeepsTheOldContentAtEveryStep) {
    TempDir dir;
    const std::string path = dir.file("f.json");
    write_file_atomic(path, "old");
    struct Case {
        Op op;
        int error;
        std::optional<uint64_t> free;
        std::string expect;
    };
    const Case cases[] = {
        {Op::kWrite, ENOSPC, std::nullopt, "disk full: writing "},
        {Op::kWrite, EIO, 1 << 20, "disk full: writing"},  // a short write at the end of space
        {Op::kWrite, EIO, kPlenty, "Input/output error"},  // a real I/O error stays one
        {Op::kFsync, EIO, kPlenty, "fsync of"},
        {Op::kRename, ENOSPC, std::nullopt, "disk full: renaming onto "},
        {Op::kRename, EACCES, std::nullopt, "Permission denied"},
    };
    for (const Case& c : cases) {
        ScopedFault fault(Fault{c.op, c.error, "f.json"}, c.free);
        const std::string m = message_of([&] { write_file_atomic(path, std::string(1000, 'n')); });
        EXPECT_NE(m.find(c.expect), std::string::npos) << m;
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_EQ(faults::fired(), 1);
        EXPECT_EQ(read_file(path), "old");
        EXPECT_EQ(files_in(dir.path()), 1u) << "a temporary file was left behind";
    }
    // With the free space and how much was to be written.
    {
        ScopedFault fault(Fault{Op::kWrite, ENOSPC}, uint64_t{12} << 20);
        const std::string m = message_of([&] { write_file_atomic(path, std::string(5000, 'n')); });
        EXPECT_NE(m.find("12.00 MiB free, at least 4.88 KiB needed"), std::string::npos) << m;
    }
    // EINTR is retried.
    {
        ScopedFault fault(Fault{Op::kWrite, EINTR, "", 0, 3});
        write_file_atomic(path, "new");
        EXPECT_EQ(faults::fired(), 3);
    }
    EXPECT_EQ(read_file(path), "new");
}

TEST(StorageFault, SafetensorsFileKeepsTheOldFileWhenItsSecondWriteFails) {
    TempDir dir;
    const std::string path = dir.file("m.safetensors");
    write_safetensors_file(path, every_dtype_record(1));
    const std::string old = read_file(path);
    {
        ScopedFault fault(Fault{Op::kWrite, ENOSPC, "m.safetensors", /*skip=*/1});
        message_of([&] { write_safetensors_file(path, every_dtype_record(2)); });
    }
    EXPECT_EQ(read_file(path), old);
    EXPECT_EQ(SafetensorsFile::open(path).names().size(), every_dtype_record(1).tensors.size());
}

TEST(StorageFault, ACommitThatFailsKeepsTheCommittedRecordsAndThePendingOnes) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    Record r;
    r.tensors["x"] = pattern_tensor(DType::kF32, {64}, 1);
    CacheWriter writer(cache, "latents", 4);
    for (int i = 0; i < 4; ++i) writer.put("good-" + std::to_string(i), r);  // one commit
    ASSERT_EQ(writer.committed(), 4);
    writer.put("later", r);
    {
        // LMDB's short write at the end of the space: EIO, on a nearly full disk.
        ScopedFault fault(Fault{Op::kCommit, EIO, dir.path().string()}, uint64_t{1} << 20);
        const std::string m = message_of([&] { writer.flush(); });
        EXPECT_NE(m.find("disk full: committing to " + dir.path().string()), std::string::npos)
            << m;
        EXPECT_NE(m.find("the batch of 1 records"), std::string::npos) << m;
    }
    {
        ScopedFault fault(Fault{Op::kCommit, EIO}, kPlenty);
        const std::string m = message_of([&] { writer.flush(); });
        EXPECT_EQ(m.find("disk full"), std::string::npos) << m;
    }
    CacheReader reader(cache, "latents");
    EXPECT_EQ(reader.count(), 4u);
    EXPECT_EQ(writer.pending(), 1u);
    writer.flush();  // room again: the pending record goes in
    EXPECT_EQ(reader.count(), 5u);
    EXPECT_EQ(reader.get("later"), r);
    EXPECT_EQ(cache.verify_all().corrupt, 0);
}

TEST(StorageFault, ASlowStageCommitsEveryFewSecondsNotOnlyWhenABatchFills) {
    TempDir dir;
    Cache cache = Cache::open(dir.path());
    Record r;
    r.tensors["x"] = pattern_tensor(DType::kF32, {4}, 1);
    CacheWriter slow(cache, "a", 1000, std::chrono::milliseconds(20));
    slow.put("one", r);
    EXPECT_EQ(slow.committed(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    slow.put("two", r);  // the oldest waited past the interval: both go in
    EXPECT_EQ(slow.committed(), 2);
    CacheWriter patient(cache, "b", 1000, std::chrono::hours(1));
    patient.put("one", r);
    patient.put("two", r);
    EXPECT_EQ(patient.committed(), 0);
}

}  // namespace
}  // namespace sf::storage
