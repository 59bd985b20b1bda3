// Stage fingerprints: everything that determines a stage's output (model weights' hash, bucket
// table, dtype, preprocessing parameters) as named fields. A cache written under one fingerprint
// is never read under another: the stage is refused with the differing fields named, or rebuilt
// when the user asks.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace sf::storage {

// Ordered, so its JSON form (and hash) does not depend on insertion order.
using Fingerprint = std::map<std::string, std::string>;

std::string fingerprint_to_json(const Fingerprint& fingerprint);
// kCorruption naming `where` when `json` is not an object of strings.
Fingerprint fingerprint_from_json(std::string_view json, const std::string& where);
// 32 hex characters; goes into each record's metadata so a record names the run that made it.
std::string fingerprint_hash(const Fingerprint& fingerprint);

// One line per differing field, "field: cache has X, run wants Y" (`stored_by` names who has
// the stored side: the cache, a checkpoint); empty when they are equal.
std::vector<std::string> fingerprint_diff(const Fingerprint& stored, const Fingerprint& wanted,
                                          const std::string& stored_by = "cache");

// Throws kInvalidArgument listing each differing field, and saying that --rebuild rebuilds the
// stage. `stage` and `where` (the cache directory) name them in the message.
void check_fingerprint(const Fingerprint& stored, const Fingerprint& wanted,
                       const std::string& stage = "", const std::string& where = "");

}  // namespace sf::storage
