// RAII wrappers over LMDB: environment, transactions, cursors and named databases.
//
// LMDB rules these wrappers keep or document:
// - One MDB_env per directory per process: closing a second env of the same files drops the
//   first one's locks. LMDBEnv::open hands out one shared env per directory.
// - The env is opened with MDB_NOTLS, so a read transaction may move between threads and a thread
//   may hold several read transactions. A write transaction stays on the thread that began it.
// - One write transaction at a time per env (LMDB serializes writers, across processes too): a
//   thread that holds a write transaction must not begin another one, or it waits forever.
// - The map is grown, never tuned by the user: LMDBEnv::write() catches MDB_MAP_FULL, aborts,
//   doubles the map and runs the transaction body again. Growing the map needs every transaction
//   of this process closed, so it waits for open readers to finish (new ones are held back a
//   moment meanwhile): do not keep a read transaction open on a thread that writes, and keep read
//   transactions short while another thread writes. Another process growing the map is
//   followed automatically (MDB_MAP_RESIZED).
#pragma once

#include <lmdb.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace sf::storage {

struct LMDBOptions {
    unsigned max_dbs = 32;
    // Address space only: the file grows with the data, and the map doubles when it fills.
    size_t initial_map_size = size_t{1} << 30;
    bool read_only = false;
    bool create = true;  // create the directory and env when missing (ignored when read_only)
};

// Thrown by a put or commit that found the map full. LMDBEnv::write() catches it and grows the
// map; code that runs its own write transactions must do the same.
class LMDBMapFull : public Error {
public:
    explicit LMDBMapFull(const std::string& m) : Error(ErrorCode::kIOError, m) {}
};

// A named database of one env. A plain handle: valid while its env is open.
class LMDBDb {
public:
    const std::string& name() const { return name_; }
    MDB_dbi dbi() const { return dbi_; }

private:
    friend class LMDBEnv;
    LMDBDb(std::string name, MDB_dbi dbi) : name_(std::move(name)), dbi_(dbi) {}
    std::string name_;
    MDB_dbi dbi_;
};

class LMDBTxn;

class LMDBEnv : public std::enable_shared_from_this<LMDBEnv> {
public:
    // Opens (or returns the already open) env of `dir`. An env already open read-only in this
    // process cannot be reopened for writing while it is in use.
    static std::shared_ptr<LMDBEnv> open(const std::string& dir, const LMDBOptions& options = {});

    LMDBEnv(const LMDBEnv&) = delete;
    LMDBEnv& operator=(const LMDBEnv&) = delete;

    const std::string& dir() const { return dir_; }
    bool read_only() const { return read_only_; }
    MDB_env* get() const { return env_.get(); }
    size_t map_size() const;
    size_t max_key_size() const { return max_key_size_; }

    // The named db `name`. With create, makes it when absent (write envs only); without, returns
    // nullopt when absent. Must not be called while this thread holds a write transaction.
    std::optional<LMDBDb> open_db(const std::string& name, bool create);
    // Names of the named dbs in the env (the keys of LMDB's main db).
    std::vector<std::string> db_names();

    // Runs `body` in a write transaction and commits it. If the map fills, the transaction is
    // aborted, the map doubled and `body` run again from the start, so `body` must only depend on
    // its transaction. Callers never see MDB_MAP_FULL.
    void write(const std::function<void(LMDBTxn&)>& body);

    // Doubles the map (at least). Waits until no transaction of this process is open.
    void grow_map();

private:
    friend class LMDBTxn;
    struct EnvCloser {
        void operator()(MDB_env* env) const { mdb_env_close(env); }
    };
    LMDBEnv() = default;
    void open_files(const std::string& dir, const LMDBOptions& options);
    // Takes the size another process grew the map to (MDB_MAP_RESIZED).
    void adopt_map_size();

    std::unique_ptr<MDB_env, EnvCloser> env_;
    std::string dir_;
    bool read_only_ = false;
    size_t max_key_size_ = 0;
    // Runs `resize` holding resize_mutex_ exclusively, with new transactions held back.
    void exclusive(const std::function<void()>& resize);
    // A new transaction waits here (a bounded time) while a resize is waiting for the open ones,
    // so a steady stream of readers cannot starve the writer. Bounded, because a thread that
    // already holds a transaction and begins another must not wait for a resize that waits for it.
    void wait_for_resize();

    // Shared by every open transaction, exclusive while the map is resized.
    std::shared_mutex resize_mutex_;
    std::atomic<int> resizes_waiting_{0};
    std::mutex gate_mutex_;
    std::condition_variable gate_;
    // mdb_dbi_open must not run in two transactions at once; also guards dbis_.
    std::mutex dbi_mutex_;
    std::map<std::string, MDB_dbi> dbis_;
};

class LMDBTxn {
public:
    enum class Mode { kRead, kWrite };

    LMDBTxn(std::shared_ptr<LMDBEnv> env, Mode mode);
    ~LMDBTxn();  // aborts when neither committed nor aborted
    LMDBTxn(LMDBTxn&& other) noexcept;
    LMDBTxn& operator=(LMDBTxn&&) = delete;
    LMDBTxn(const LMDBTxn&) = delete;
    LMDBTxn& operator=(const LMDBTxn&) = delete;

    void commit();
    void abort() noexcept;

    MDB_txn* get() const { return txn_; }
    LMDBEnv& env() const { return *env_; }
    bool writable() const { return mode_ == Mode::kWrite; }

    // The value's bytes live in the map: valid until this transaction ends or writes again.
    std::optional<std::string_view> get(const LMDBDb& db, std::string_view key) const;
    void put(const LMDBDb& db, std::string_view key, std::string_view value);
    bool del(const LMDBDb& db, std::string_view key);
    // Deletes every entry of `db`; the handle stays valid.
    void clear(const LMDBDb& db);
    size_t count(const LMDBDb& db) const;

private:
    friend class LMDBCursor;
    std::shared_ptr<LMDBEnv> env_;
    Mode mode_;
    std::shared_lock<std::shared_mutex> resize_lock_;
    MDB_txn* txn_ = nullptr;
    // A write transaction frees its cursors when it ends, so a cursor must be closed first.
    mutable int open_cursors_ = 0;
};

// A cursor over one db inside one transaction; closed on destruction (before the transaction).
class LMDBCursor {
public:
    LMDBCursor(const LMDBTxn& txn, const LMDBDb& db);
    ~LMDBCursor();
    LMDBCursor(const LMDBCursor&) = delete;
    LMDBCursor& operator=(const LMDBCursor&) = delete;

    // Each positions the cursor and returns false when there is no such entry.
    bool first();
    bool next();
    bool seek(std::string_view key);  // first entry with key >= `key`

    std::string_view key() const { return to_view(key_); }
    std::string_view value() const { return to_view(value_); }

private:
    static std::string_view to_view(const MDB_val& v) {
        return {static_cast<const char*>(v.mv_data), v.mv_size};
    }
    bool move(MDB_cursor_op op);

    const LMDBTxn& txn_;
    MDB_cursor* cursor_ = nullptr;
    std::string where_;
    MDB_val key_{0, nullptr};
    MDB_val value_{0, nullptr};
};

// sf::Error for an LMDB return code; `what` says what was being done, and on which file or key.
Error lmdb_error(const std::string& what, int rc);
// Throws lmdb_error(what, rc), or LMDBMapFull for MDB_MAP_FULL (which a returned Error would
// slice).
[[noreturn]] void throw_lmdb_error(const std::string& what, int rc);

}  // namespace sf::storage
