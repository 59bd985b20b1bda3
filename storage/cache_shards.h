// A cache written by sharded prep (a data-parallel launch of `sanaflow prep`): each of the N ranks
// writes its own complete cache, CACHE/shard-0000r-of-0000N/, with its own fingerprints, manifest
// and rejects, so no LMDB environment is ever written by two processes. A sample belongs to the
// shard its content key hashes to (shard_of), so the split does not depend on file order.
// Torch-free.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace sf::storage {

constexpr int kMaxShards = 99999;  // five digits

// "shard-00003-of-00008" for rank 3 of 8.
std::string shard_dir_name(int rank, int count);

// Which of `count` shards `key` (a content key, or a rejected file's path) belongs to: a hash of
// its bytes, the same on every rank and in every run.
int shard_of(const std::string& key, int count);

// The cache folders `cache_dir` stands for: itself when it is a cache of one process (or holds
// nothing yet), else its shard folders in rank order. kInvalidArgument naming the folder when its
// shards are not one whole set (a count that differs, a shard missing), or when it holds both a
// cache of its own and shards.
std::vector<std::string> cache_shard_dirs(const std::string& cache_dir);

// The shard counts of the shard folders in `cache_dir` (none: empty; one prep's: one count).
std::set<int> cache_shard_counts(const std::string& cache_dir);

}  // namespace sf::storage
