// Finds the training samples: image paths with their captions. Three sources, as in diffusers'
// DreamBooth and text-to-image scripts:
//   1. a folder of images, each with a same-stem caption file: cat.png + cat.txt;
//   2. a JSONL manifest, one {"file": ..., "caption": ...} object per line;
//   3. --instance_prompt: one caption for every image (DreamBooth).
// Bad items (no caption, bad JSON line, missing file) are rejected with their reason and the
// scan goes on; only a missing or unusable folder or manifest is an error. Torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace sf::stages {

struct DatasetConfig {
    // Folder of images. Scanned recursively (when `recursive`) for files whose extension is in
    // `extensions`; names starting with '.' are skipped, files and folders alike.
    std::string instance_data_dir;
    // JSONL manifest. When empty and <instance_data_dir>/metadata.jsonl exists, that file is
    // used (the Hugging Face imagefolder convention) instead of scanning the folder. Relative
    // "file" entries are resolved against the manifest's own folder. "file_name" is accepted
    // for "file" and "text" for "caption", as in imagefolder metadata.
    std::string manifest;
    // When set, the caption of every image, in both folder and manifest mode; caption files
    // and manifest captions are then ignored and optional. This is DreamBooth's behaviour.
    std::string instance_prompt;
    // The manifest key of the captions; empty: "caption", else "text", else "prompt" (the columns
    // imagefolder metadata uses). diffusers' --caption_column.
    std::string caption_column;
    // Case-insensitive, with or without the leading dot. Used in folder mode only: a manifest
    // names its files explicitly.
    std::vector<std::string> extensions = {"jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff"};
    bool recursive = true;
};

struct Sample {
    std::string path;     // the image file; UTF-8 bytes as the file system gives them
    std::string caption;  // UTF-8, trimmed of surrounding white space
};

struct DatasetScan {
    std::vector<Sample> samples;  // sorted by path bytes
    // (source, reason): source is the image path, or <manifest>:<line>. In path order in folder
    // mode and in line order in manifest mode, so two scans of the same data agree.
    std::vector<std::pair<std::string, std::string>> rejects;
    std::string manifest_used;  // the manifest read, or empty in folder mode
};

// Throws sf::Error: kNotFound naming the folder or manifest that does not exist,
// kInvalidArgument when neither a folder nor a manifest is given or the folder is a file,
// kIOError when a directory cannot be listed.
DatasetScan scan_dataset(const DatasetConfig& config);

// The caption text of a caption file's bytes: UTF-8 BOM dropped, surrounding white space
// trimmed. Returns false (and leaves `caption` alone) when the bytes are not valid UTF-8.
bool caption_from_bytes(const std::string& bytes, std::string* caption);

}  // namespace sf::stages
