// Crash safety: a writer process killed with SIGKILL at a random moment leaves only whole, valid
// batches, and a rerun that skips what is there completes the set with no duplicates.
//
// The child is this test binary run again with a gtest filter and an environment variable (not a
// fork: forking a process that may hold LibTorch's threads is unsafe).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/cache_writer.h"
#include "storage/content_key.h"
#include "storage_test_util.h"

extern char** environ;

namespace sf::storage {
namespace {

using testing::pattern_tensor;
using testing::TempDir;

constexpr const char* kChildDirVar = "SANAFLOW_STORAGE_CRASH_CHILD_DIR";
constexpr const char* kChildTest = "StorageCrash.WriterRunCompletesTheSet";
constexpr int kRecords = 1000;
constexpr size_t kBatch = 8;

std::string crash_key(int i) {
    return content_key_of("clip-" + std::to_string(i), {{"test", "crash"}});
}

Record crash_record(int i) {
    Record r;
    r.tensors["latent"] = pattern_tensor(DType::kF32, {16, 16, 16}, static_cast<uint32_t>(i));
    r.metadata[schema::kSource] = "clip-" + std::to_string(i);
    return r;
}

// One run of the writer: skips the keys already committed, as a resumed prep run does.
void write_set(const std::string& dir) {
    CacheOptions options;
    options.initial_map_size = 256 << 10;  // small, so map growth happens while being killed too
    Cache cache = Cache::open(dir, options);
    cache.ensure_fingerprint("crash_test", {{"stage", "crash_test"}}, {"records"}, false);
    CacheReader reader(cache, "records");
    CacheWriter writer(cache, "records", kBatch);
    for (int i = 0; i < kRecords; ++i) {
        std::string key = crash_key(i);
        if (!reader.contains(key)) writer.put(key, crash_record(i));
    }
    writer.flush();
}

// Every committed record is intact and expected; returns how many there are.
size_t check_committed(const std::string& dir) {
    std::map<std::string, int> expected;
    for (int i = 0; i < kRecords; ++i) expected[crash_key(i)] = i;
    Cache cache = Cache::open(dir);
    EXPECT_EQ(cache.verify_all().corrupt, 0);
    std::set<std::string> seen;
    CacheReader(cache, "records").for_each([&](std::string_view key, std::string_view frame) {
        auto it = expected.find(std::string(key));
        ASSERT_NE(it, expected.end()) << "unexpected key " << key;
        EXPECT_TRUE(seen.insert(std::string(key)).second);
        EXPECT_EQ(decode_record(frame, std::string(key)), crash_record(it->second));
    });
    return seen.size();
}

// The child's output goes to a log file in the cache directory, shown when the child fails.
std::string child_log(const std::string& dir) { return dir + "/child.log"; }

pid_t spawn_child(const std::string& dir) {
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
    exe[n] = '\0';
    std::string filter = std::string("--gtest_filter=") + kChildTest;
    std::vector<char*> argv = {exe, filter.data(), nullptr};
    std::string var = std::string(kChildDirVar) + "=" + dir;
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(var.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    std::string log = child_log(dir);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, exe, &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn failed");
    return pid;
}

// The child's entry point, and on its own an uninterrupted run followed by an idle rerun.
TEST(StorageCrash, WriterRunCompletesTheSet) {
    if (const char* dir = std::getenv(kChildDirVar)) {
        write_set(dir);
        return;
    }
    TempDir dir;
    write_set(dir.path());
    EXPECT_EQ(check_committed(dir.path()), static_cast<size_t>(kRecords));
    write_set(dir.path());
    EXPECT_EQ(check_committed(dir.path()), static_cast<size_t>(kRecords));
}

// Polls the record count (through a read-only env of this process, which also sees the child grow
// the map) until it reaches `target` or the child exits; returns whether the child exited.
bool wait_for_count(const std::string& dir, pid_t pid, size_t target, int* status) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::optional<CacheReader> reader;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(pid, status, WNOHANG) == pid) return true;
        try {
            if (!reader) {
                CacheOptions options;
                options.read_only = true;
                options.initial_map_size = 64 << 10;  // so the child's growth outruns our map
                reader.emplace(Cache::open(dir, options), "records");
            }
            if (reader->count() >= target) return false;
        } catch (const Error&) {
            // The child has not created the cache yet.
        }
        std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    ADD_FAILURE() << "the child made no progress";
    return false;
}

TEST(StorageCrash, KilledWriterLeavesWholeBatchesAndRerunCompletes) {
    if (std::getenv(kChildDirVar)) GTEST_SKIP() << "child process";
    TempDir dir;
    std::mt19937 rng(20240611);
    int killed_mid_run = 0;
    size_t count = 0;
    for (int round = 0; round < 4; ++round) {
        // Kill after a random number of this run's batches, at a random moment within a batch.
        size_t batches_left = (kRecords - count) / kBatch;
        size_t target = count + kBatch * (1 + rng() % std::max<size_t>(1, batches_left * 2 / 3));
        pid_t pid = spawn_child(dir.path());
        int status = 0;
        if (!wait_for_count(dir.path(), pid, target, &status)) {
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
            ::kill(pid, SIGKILL);
            ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        }
        size_t before = count;
        count = check_committed(dir.path());
        EXPECT_GE(count, before);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL &&
            count < static_cast<size_t>(kRecords)) {
            ++killed_mid_run;
            EXPECT_EQ(count % kBatch, 0u) << "a killed run leaves whole batches only";
        } else {
            ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
                << "child failed:\n"
                << read_file(child_log(dir.path()));
        }
    }
    EXPECT_GE(killed_mid_run, 3) << "the child finished before it could be killed";

    pid_t pid = spawn_child(dir.path());
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the rerun failed:\n"
                                                               << read_file(child_log(dir.path()));
    EXPECT_EQ(check_committed(dir.path()), static_cast<size_t>(kRecords));
}

}  // namespace
}  // namespace sf::storage
