#include "storage/lmdb.h"

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/check.h"
#include "core/log.h"
#include "storage/atomic_file.h"
#include "storage/fault_injection.h"

namespace sf::storage {
namespace {

// Growth stops here: past it a full map means a runaway writer, not a big dataset.
constexpr size_t kMaxMapSize = size_t{1} << 44;  // 16 TiB of address space

// The process-wide table of open envs, one per canonical directory. An entry whose env is being
// destroyed stays until mdb_env_close has returned, so a reopen never overlaps a close.
struct EnvRegistry {
    std::mutex mutex;
    std::condition_variable closed;
    std::map<std::string, std::weak_ptr<LMDBEnv>> envs;
};

EnvRegistry& registry() {
    static EnvRegistry* r = new EnvRegistry;  // never destroyed: envs may close during exit
    return *r;
}

std::string short_key(std::string_view key) {
    constexpr size_t kMax = 80;
    if (key.size() <= kMax) return std::string(key);
    return std::string(key.substr(0, kMax)) + "...";
}

MDB_val to_val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }

}  // namespace

Error lmdb_error(const std::string& what, int rc) {
    std::string text = what + ": " + mdb_strerror(rc);
    switch (rc) {
        case MDB_MAP_FULL:
            return Error::IOError(text);
        case MDB_CORRUPTED:
        case MDB_PAGE_NOTFOUND:
        case MDB_INVALID:
        case MDB_VERSION_MISMATCH:
            return Error::Corruption(text);
        case MDB_READERS_FULL:
            return Error::IOError(text + " (too many open read transactions in this process)");
        case MDB_TXN_FULL:
            return Error::IOError(text + " (write batch too large)");
        case ENOSPC:
            return Error::IOError("disk full: " + text);
        case ENOMEM:
            return Error::OutOfMemory(text);
        case ENOENT:
            return Error::NotFound(text);
        default:
            return Error::IOError(text);
    }
}

void throw_lmdb_error(const std::string& what, int rc) {
    if (rc == MDB_MAP_FULL) throw LMDBMapFull(what + ": " + mdb_strerror(rc));
    throw lmdb_error(what, rc);
}

std::shared_ptr<LMDBEnv> LMDBEnv::open(const std::string& dir, const LMDBOptions& options) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!options.read_only && options.create) {
        fs::create_directories(dir, ec);
        if (ec) throw Error::IOError("creating cache directory " + dir + ": " + ec.message());
    }
    if (!fs::is_directory(dir, ec))
        throw Error::NotFound("cache directory " + dir + " does not exist");
    if ((options.read_only || !options.create) && !fs::exists(fs::path(dir) / "data.mdb", ec)) {
        throw Error::NotFound(dir + " holds no LMDB env (no data.mdb)");
    }
    std::string key = fs::canonical(dir, ec).string();
    if (ec) throw Error::IOError("resolving " + dir + ": " + ec.message());

    EnvRegistry& r = registry();
    std::unique_lock<std::mutex> lock(r.mutex);
    while (true) {
        auto it = r.envs.find(key);
        if (it == r.envs.end()) break;
        if (auto env = it->second.lock()) {
            if (env->read_only_ && !options.read_only) {
                throw Error::InvalidArgument("cache " + dir +
                                             " is already open read-only in this process");
            }
            return env;
        }
        r.closed.wait(lock);  // its last owner is closing it right now
    }

    std::shared_ptr<LMDBEnv> env(new LMDBEnv, [key](LMDBEnv* e) {
        EnvRegistry& reg = registry();
        std::lock_guard<std::mutex> guard(reg.mutex);
        delete e;
        // The entry may be another env's already, if this one failed to open.
        auto entry = reg.envs.find(key);
        if (entry != reg.envs.end() && entry->second.expired()) reg.envs.erase(entry);
        reg.closed.notify_all();
    });
    try {
        env->open_files(dir, options);
    } catch (...) {
        lock.unlock();  // the deleter takes the registry lock
        env.reset();
        throw;
    }
    r.envs[key] = env;
    return env;
}

void LMDBEnv::open_files(const std::string& dir, const LMDBOptions& options) {
    dir_ = dir;
    read_only_ = options.read_only;
    MDB_env* raw = nullptr;
    int rc = mdb_env_create(&raw);
    if (rc != 0) throw_lmdb_error("creating LMDB env for " + dir, rc);
    env_.reset(raw);
    if ((rc = mdb_env_set_maxdbs(raw, options.max_dbs)) != 0 ||
        (rc = mdb_env_set_mapsize(raw, options.initial_map_size)) != 0) {
        throw_lmdb_error("configuring LMDB env for " + dir, rc);
    }
    unsigned flags = MDB_NOTLS | (options.read_only ? MDB_RDONLY : 0);
    rc = mdb_env_open(raw, dir.c_str(), flags, 0644);
    if (rc != 0) throw_lmdb_error("opening LMDB env in " + dir, rc);
    // Reader slots of processes that were killed stay taken until someone clears them.
    int dead = 0;
    mdb_reader_check(raw, &dead);
    if (dead > 0) log_debug("cache {}: cleared {} stale reader slots", dir, dead);
    max_key_size_ = static_cast<size_t>(mdb_env_get_maxkeysize(raw));
}

size_t LMDBEnv::map_size() const {
    MDB_envinfo info;
    mdb_env_info(env_.get(), &info);
    return info.me_mapsize;
}

void LMDBEnv::exclusive(const std::function<void()>& resize) {
    ++resizes_waiting_;
    struct Release {
        LMDBEnv* env;
        ~Release() {
            std::lock_guard<std::mutex> lock(env->gate_mutex_);
            --env->resizes_waiting_;
            env->gate_.notify_all();
        }
    } release{this};
    std::unique_lock<std::shared_mutex> lock(resize_mutex_);
    resize();
}

void LMDBEnv::wait_for_resize() {
    if (resizes_waiting_.load() == 0) return;
    std::unique_lock<std::mutex> lock(gate_mutex_);
    gate_.wait_for(lock, std::chrono::milliseconds(200),
                   [&] { return resizes_waiting_.load() == 0; });
}

void LMDBEnv::adopt_map_size() {
    exclusive([&] {
        int rc = mdb_env_set_mapsize(env_.get(), 0);
        if (rc != 0) throw_lmdb_error("adopting the map size of " + dir_, rc);
    });
}

void LMDBEnv::grow_map() {
    exclusive([&] {
        size_t target = map_size() * 2;
        if (target > kMaxMapSize) {
            throw Error::IOError("cache " + dir_ + " would need a map over " +
                                 format_bytes(static_cast<int64_t>(kMaxMapSize)));
        }
        int rc = mdb_env_set_mapsize(env_.get(), target);
        if (rc != 0) throw_lmdb_error("growing the map of " + dir_, rc);
        log_debug("cache {}: map grown to {}", dir_, format_bytes(static_cast<int64_t>(target)));
    });
}

void LMDBEnv::write(const std::function<void(LMDBTxn&)>& body) {
    while (true) {
        try {
            LMDBTxn txn(shared_from_this(), LMDBTxn::Mode::kWrite);
            body(txn);
            txn.commit();
            return;
        } catch (const LMDBMapFull&) {
            // The transaction is gone (aborted by its destructor), so the map may be resized.
        }
        grow_map();
    }
}

std::optional<LMDBDb> LMDBEnv::open_db(const std::string& name, bool create) {
    if (create && read_only_) {
        throw Error::InvalidArgument("cannot create db '" + name + "' in read-only cache " + dir_);
    }
    std::lock_guard<std::mutex> lock(dbi_mutex_);
    auto it = dbis_.find(name);
    if (it != dbis_.end()) return LMDBDb(name, it->second);

    std::optional<MDB_dbi> found;
    auto open_in = [&](LMDBTxn& txn) {
        MDB_dbi dbi = 0;
        int rc = mdb_dbi_open(txn.get(), name.c_str(), create ? MDB_CREATE : 0, &dbi);
        if (rc == MDB_NOTFOUND) return;
        if (rc != 0) throw_lmdb_error("opening db '" + name + "' in " + dir_, rc);
        found = dbi;
    };
    if (create) {
        write(open_in);
    } else {
        // A handle opened in a read transaction survives only if that transaction commits.
        LMDBTxn txn(shared_from_this(), LMDBTxn::Mode::kRead);
        open_in(txn);
        txn.commit();
    }
    if (!found) return std::nullopt;
    dbis_[name] = *found;
    return LMDBDb(name, *found);
}

std::vector<std::string> LMDBEnv::db_names() {
    std::lock_guard<std::mutex> lock(dbi_mutex_);
    LMDBTxn txn(shared_from_this(), LMDBTxn::Mode::kRead);
    MDB_dbi main_dbi = 0;
    int rc = mdb_dbi_open(txn.get(), nullptr, 0, &main_dbi);
    if (rc != 0) throw_lmdb_error("opening the main db of " + dir_, rc);
    std::vector<std::string> names;
    {
        LMDBCursor cursor(txn, LMDBDb("", main_dbi));
        for (bool ok = cursor.first(); ok; ok = cursor.next()) names.emplace_back(cursor.key());
    }
    txn.commit();
    return names;
}

LMDBTxn::LMDBTxn(std::shared_ptr<LMDBEnv> env, Mode mode) : env_(std::move(env)), mode_(mode) {
    if (mode_ == Mode::kWrite && env_->read_only_) {
        throw Error::InvalidArgument("cache " + env_->dir_ + " is open read-only");
    }
    for (int attempt = 0;; ++attempt) {
        env_->wait_for_resize();
        resize_lock_ = std::shared_lock<std::shared_mutex>(env_->resize_mutex_);
        int rc = mdb_txn_begin(env_->get(), nullptr, mode_ == Mode::kRead ? MDB_RDONLY : 0, &txn_);
        if (rc == 0) return;
        txn_ = nullptr;
        resize_lock_.unlock();
        // Another process grew the map past ours.
        if (rc == MDB_MAP_RESIZED && attempt < 3) {
            env_->adopt_map_size();
            continue;
        }
        throw_lmdb_error("beginning a transaction in " + env_->dir_, rc);
    }
}

LMDBTxn::~LMDBTxn() { abort(); }

LMDBTxn::LMDBTxn(LMDBTxn&& other) noexcept
    : env_(std::move(other.env_)),
      mode_(other.mode_),
      resize_lock_(std::move(other.resize_lock_)),
      txn_(std::exchange(other.txn_, nullptr)) {
    SF_CHECK(other.open_cursors_ == 0, "moving an LMDB transaction with open cursors");
}

void LMDBTxn::commit() {
    SF_CHECK(txn_ != nullptr, "commit of a finished LMDB transaction");
    SF_CHECK(open_cursors_ == 0, "commit of an LMDB transaction with open cursors");
    int rc = faults::check(faults::Op::kCommit, env_->dir_);
    if (rc != 0) {
        mdb_txn_abort(std::exchange(txn_, nullptr));
    } else {
        rc = mdb_txn_commit(std::exchange(txn_, nullptr));  // frees the txn even on failure
    }
    resize_lock_.unlock();
    if (rc == ENOSPC || rc == EIO || rc == EDQUOT) {
        // LMDB reports a short write at the end of the space as EIO: a nearly full file system
        // says what it was.
        const std::optional<uint64_t> free = faults::free_bytes(env_->dir_);
        if (rc != EIO || (free && *free < faults::kNearlyFullBytes))
            throw Error::IOError(disk_full_message("committing to " + env_->dir_, free, 0));
    }
    if (rc != 0) throw_lmdb_error("committing to " + env_->dir_, rc);
}

void LMDBTxn::abort() noexcept {
    if (txn_ != nullptr) mdb_txn_abort(std::exchange(txn_, nullptr));
    if (resize_lock_.owns_lock()) resize_lock_.unlock();
}

std::optional<std::string_view> LMDBTxn::get(const LMDBDb& db, std::string_view key) const {
    if (key.empty() || key.size() > env_->max_key_size_) return std::nullopt;
    MDB_val k = to_val(key);
    MDB_val v{0, nullptr};
    int rc = mdb_get(txn_, db.dbi(), &k, &v);
    if (rc == MDB_NOTFOUND) return std::nullopt;
    if (rc != 0) {
        throw_lmdb_error(
            "reading key " + short_key(key) + " of db '" + db.name() + "' in " + env_->dir_, rc);
    }
    return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

void LMDBTxn::put(const LMDBDb& db, std::string_view key, std::string_view value) {
    if (key.empty() || key.size() > env_->max_key_size_) {
        throw Error::InvalidArgument("key " + short_key(key) + " for db '" + db.name() +
                                     "' must be 1 to " + std::to_string(env_->max_key_size_) +
                                     " bytes, it is " + std::to_string(key.size()));
    }
    MDB_val k = to_val(key);
    MDB_val v = to_val(value);
    int rc = mdb_put(txn_, db.dbi(), &k, &v, 0);
    if (rc != 0) {
        throw_lmdb_error(
            "writing key " + short_key(key) + " of db '" + db.name() + "' in " + env_->dir_, rc);
    }
}

bool LMDBTxn::del(const LMDBDb& db, std::string_view key) {
    if (key.empty() || key.size() > env_->max_key_size_) return false;
    MDB_val k = to_val(key);
    int rc = mdb_del(txn_, db.dbi(), &k, nullptr);
    if (rc == MDB_NOTFOUND) return false;
    if (rc != 0) {
        throw_lmdb_error(
            "deleting key " + short_key(key) + " of db '" + db.name() + "' in " + env_->dir_, rc);
    }
    return true;
}

void LMDBTxn::clear(const LMDBDb& db) {
    int rc = mdb_drop(txn_, db.dbi(), 0);
    if (rc != 0) throw_lmdb_error("emptying db '" + db.name() + "' in " + env_->dir_, rc);
}

size_t LMDBTxn::count(const LMDBDb& db) const {
    MDB_stat stat;
    int rc = mdb_stat(txn_, db.dbi(), &stat);
    if (rc != 0) throw_lmdb_error("stat of db '" + db.name() + "' in " + env_->dir_, rc);
    return stat.ms_entries;
}

LMDBCursor::LMDBCursor(const LMDBTxn& txn, const LMDBDb& db)
    : txn_(txn), where_("db '" + db.name() + "' in " + txn.env().dir()) {
    int rc = mdb_cursor_open(txn.get(), db.dbi(), &cursor_);
    if (rc != 0) throw_lmdb_error("opening a cursor on " + where_, rc);
    ++txn_.open_cursors_;
}

LMDBCursor::~LMDBCursor() {
    mdb_cursor_close(cursor_);
    --txn_.open_cursors_;
}

bool LMDBCursor::move(MDB_cursor_op op) {
    int rc = mdb_cursor_get(cursor_, &key_, &value_, op);
    if (rc == MDB_NOTFOUND) return false;
    if (rc != 0) throw_lmdb_error("iterating " + where_, rc);
    return true;
}

bool LMDBCursor::first() { return move(MDB_FIRST); }
bool LMDBCursor::next() { return move(MDB_NEXT); }

bool LMDBCursor::seek(std::string_view key) {
    key_ = to_val(key);
    return move(MDB_SET_RANGE);
}

}  // namespace sf::storage
