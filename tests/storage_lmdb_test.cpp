// LMDB wrappers: env sharing, transactions, cursors, map growth.
#include <gtest/gtest.h>

#include <thread>

#include "storage/lmdb.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

using testing::error_code_of;
using testing::TempDir;

std::string value_for(int i) {
    return std::string(static_cast<size_t>(100 + i % 50), static_cast<char>('a' + i % 26));
}

TEST(StorageLMDB, OneEnvPerDirectory) {
    TempDir dir;
    auto a = LMDBEnv::open(dir.path());
    auto b = LMDBEnv::open(dir.file("."));
    EXPECT_EQ(a.get(), b.get());
}

TEST(StorageLMDB, PutGetDeleteAndCursorOrder) {
    TempDir dir;
    auto env = LMDBEnv::open(dir.path());
    LMDBDb db = *env->open_db("things", true);
    env->write([&](LMDBTxn& txn) {
        for (const char* k : {"b", "c", "a"}) txn.put(db, k, std::string("v") + k);
    });
    LMDBTxn txn(env, LMDBTxn::Mode::kRead);
    EXPECT_EQ(txn.get(db, "a"), std::optional<std::string_view>("va"));
    EXPECT_FALSE(txn.get(db, "z").has_value());
    EXPECT_EQ(txn.count(db), 3u);
    std::string order;
    {
        LMDBCursor cursor(txn, db);
        for (bool ok = cursor.first(); ok; ok = cursor.next()) order += cursor.key();
        ASSERT_TRUE(cursor.seek("bb"));
        EXPECT_EQ(cursor.key(), "c");
    }
    EXPECT_EQ(order, "abc");
    txn.abort();
    env->write([&](LMDBTxn& w) {
        EXPECT_TRUE(w.del(db, "a"));
        EXPECT_FALSE(w.del(db, "a"));
    });
    EXPECT_EQ(LMDBTxn(env, LMDBTxn::Mode::kRead).count(db), 2u);
    EXPECT_EQ(env->db_names(), std::vector<std::string>{"things"});
}

TEST(StorageLMDB, UncommittedWriteIsAbortedByDestructor) {
    TempDir dir;
    auto env = LMDBEnv::open(dir.path());
    LMDBDb db = *env->open_db("d", true);
    {
        LMDBTxn txn(env, LMDBTxn::Mode::kWrite);
        txn.put(db, "k", "v");
    }
    EXPECT_FALSE(LMDBTxn(env, LMDBTxn::Mode::kRead).get(db, "k").has_value());
    // A body that throws leaves nothing behind either.
    EXPECT_THROW(env->write([&](LMDBTxn& txn) {
        txn.put(db, "k", "v");
        throw Error::InvalidArgument("stop");
    }),
                 Error);
    EXPECT_FALSE(LMDBTxn(env, LMDBTxn::Mode::kRead).get(db, "k").has_value());
}

TEST(StorageLMDB, MapGrowsWhenFull) {
    TempDir dir;
    LMDBOptions options;
    options.initial_map_size = 64 << 10;
    auto env = LMDBEnv::open(dir.path(), options);
    size_t initial = env->map_size();
    LMDBDb db = *env->open_db("d", true);
    const std::string value(4096, 'x');
    for (int batch = 0; batch < 20; ++batch) {
        env->write([&](LMDBTxn& txn) {
            for (int i = 0; i < 50; ++i) txn.put(db, std::to_string(batch * 50 + i), value);
        });
    }
    EXPECT_GE(env->map_size(), 1000 * 4096u);
    EXPECT_GT(env->map_size(), initial);
    LMDBTxn txn(env, LMDBTxn::Mode::kRead);
    EXPECT_EQ(txn.count(db), 1000u);
    for (int i = 0; i < 1000; ++i)
        ASSERT_EQ(txn.get(db, std::to_string(i)), std::optional<std::string_view>(value));
}

TEST(StorageLMDB, ReadTransactionMovesBetweenThreads) {
    TempDir dir;
    auto env = LMDBEnv::open(dir.path());
    LMDBDb db = *env->open_db("d", true);
    env->write([&](LMDBTxn& txn) {
        for (int i = 0; i < 100; ++i) txn.put(db, std::to_string(i), value_for(i));
    });
    LMDBTxn txn(env, LMDBTxn::Mode::kRead);
    size_t seen = 0;
    std::thread other([&] {
        LMDBCursor cursor(txn, db);
        for (bool ok = cursor.first(); ok; ok = cursor.next()) ++seen;
    });
    other.join();
    EXPECT_EQ(seen, 100u);
}

TEST(StorageLMDB, KeyLimitsAndReadOnlyAreEnforced) {
    TempDir dir;
    auto env = LMDBEnv::open(dir.path());
    LMDBDb db = *env->open_db("d", true);
    std::string message;
    EXPECT_EQ(error_code_of(
                  [&] { env->write([&](LMDBTxn& t) { t.put(db, std::string(600, 'k'), "v"); }); },
                  &message),
              ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("db 'd'"), std::string::npos) << message;
    EXPECT_EQ(error_code_of([&] { env->write([&](LMDBTxn& t) { t.put(db, "", "v"); }); }),
              ErrorCode::kInvalidArgument);
    env.reset();

    LMDBOptions read_only;
    read_only.read_only = true;
    auto ro = LMDBEnv::open(dir.path(), read_only);
    EXPECT_EQ(error_code_of([&] { LMDBTxn(ro, LMDBTxn::Mode::kWrite); }),
              ErrorCode::kInvalidArgument);
    EXPECT_FALSE(ro->open_db("absent", false).has_value());
    EXPECT_EQ(error_code_of([&] { LMDBEnv::open(dir.path()); }), ErrorCode::kInvalidArgument);
}

TEST(StorageLMDB, MissingDirectoryIsNotFoundWithoutCreate) {
    TempDir dir;
    LMDBOptions options;
    options.create = false;
    EXPECT_EQ(error_code_of([&] { LMDBEnv::open(dir.file("nope"), options); }),
              ErrorCode::kNotFound);
}

}  // namespace
}  // namespace sf::storage
