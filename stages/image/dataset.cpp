#include "stages/image/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "storage/cache_schema.h"
#include "storage/json_text.h"

namespace sf::stages {
namespace {

namespace fs = std::filesystem;

std::string lower_ascii(std::string s) {
    for (char& c : s) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return s;
}

std::string trim(const std::string& s) {
    const char* kSpace = " \t\r\n\f\v";
    const size_t first = s.find_first_not_of(kSpace);
    if (first == std::string::npos) return {};
    return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. A caption that fails
// this would break the tokenizer later, far from the file at fault.
bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t extra = 0;
        uint32_t code = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            extra = 1, code = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, code = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, code = c & 0x07;
        } else {
            return false;
        }
        if (s.size() - i <= extra) return false;
        for (size_t k = 1; k <= extra; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            code = (code << 6) | (cc & 0x3F);
        }
        static const uint32_t kMinimum[] = {0, 0x80, 0x800, 0x10000};
        if (code < kMinimum[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
            return false;
        }
        i += extra + 1;
    }
    return true;
}

std::string caption_too_long(uintmax_t bytes) {
    return fmt::format(
        "caption of {} bytes is over the limit of {} (the text encoder keeps its first 300 tokens)",
        bytes, storage::schema::kMaxCaptionBytes);
}

// Returns false when the file cannot be opened or read.
bool read_whole_file(const fs::path& path, std::string* out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::ostringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) return false;
    *out = buffer.str();
    return true;
}

std::string path_string(const fs::path& p) { return p.string(); }

// `bytes` with every byte that is not part of valid UTF-8, and every control character, written
// as \xNN: a file name the file system allows but a message or a JSON record cannot hold.
std::string escaped(const std::string& bytes) {
    std::string out;
    size_t i = 0;
    while (i < bytes.size()) {
        size_t length = 1;
        const auto c = static_cast<unsigned char>(bytes[i]);
        if (c >= 0x80) {
            length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (i + length > bytes.size() || !valid_utf8(bytes.substr(i, length))) length = 0;
        }
        if (length == 0 || c < 0x20 || c == 0x7F) {
            out += fmt::format("\\x{:02X}", c);
            ++i;
        } else {
            out.append(bytes, i, length);
            i += length;
        }
    }
    return out;
}

// Moves to the rejects the samples prep could not store: a path that is not valid UTF-8 (every
// record and message is UTF-8) and a caption longer than the cache accepts.
void reject_unstorable(DatasetScan* scan) {
    std::vector<Sample> kept;
    for (Sample& sample : scan->samples) {
        if (!valid_utf8(sample.path)) {
            scan->rejects.emplace_back(escaped(sample.path),
                                       "file name is not valid UTF-8 (bytes shown as \\xNN)");
        } else if (sample.caption.size() > storage::schema::kMaxCaptionBytes) {
            scan->rejects.emplace_back(sample.path, caption_too_long(sample.caption.size()));
        } else {
            kept.push_back(std::move(sample));
        }
    }
    scan->samples = std::move(kept);
}

void scan_folder(const fs::path& dir, const DatasetConfig& config, DatasetScan* scan) {
    std::set<std::string> extensions;
    for (const std::string& e : config.extensions) {
        extensions.insert(lower_ascii(!e.empty() && e[0] == '.' ? e.substr(1) : e));
    }
    std::vector<fs::path> images;
    std::error_code ec;
    auto consider = [&](const fs::directory_entry& entry, bool* skip_directory) {
        const std::string name = entry.path().filename().string();
        std::error_code type_ec;
        if (!name.empty() && name[0] == '.') {
            *skip_directory = entry.is_directory(type_ec);
            return;
        }
        if (!entry.is_regular_file(type_ec)) return;  // follows symlinks
        std::string extension = lower_ascii(entry.path().extension().string());
        if (!extension.empty()) extension.erase(0, 1);
        if (extensions.count(extension) != 0) images.push_back(entry.path());
    };
    if (config.recursive) {
        fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
        for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            bool skip = false;
            consider(*it, &skip);
            if (skip) it.disable_recursion_pending();
        }
    } else {
        fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
        for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
            bool skip = false;
            consider(*it, &skip);
        }
    }
    if (ec) throw Error::IOError("cannot list " + path_string(dir) + ": " + ec.message());

    std::sort(images.begin(), images.end(),
              [](const fs::path& a, const fs::path& b) { return a.native() < b.native(); });
    for (const fs::path& image : images) {
        if (!config.instance_prompt.empty()) {
            scan->samples.push_back({path_string(image), trim(config.instance_prompt)});
            continue;
        }
        fs::path caption_path = image;
        caption_path.replace_extension(".txt");
        const std::string caption_name = caption_path.filename().string();
        std::string bytes;
        std::error_code exists_ec;
        if (!fs::is_regular_file(caption_path, exists_ec)) {
            scan->rejects.emplace_back(path_string(image), "no caption file " + caption_name);
            continue;
        }
        // Not read at all when too long: a caption file may be any size.
        const uintmax_t size = fs::file_size(caption_path, exists_ec);
        if (!exists_ec && size > storage::schema::kMaxCaptionBytes + 3 /* a BOM */) {
            scan->rejects.emplace_back(path_string(image), caption_too_long(size));
            continue;
        }
        if (!read_whole_file(caption_path, &bytes)) {
            scan->rejects.emplace_back(path_string(image),
                                       "cannot read caption file " + caption_name);
            continue;
        }
        std::string caption;
        if (!caption_from_bytes(bytes, &caption)) {
            scan->rejects.emplace_back(path_string(image),
                                       "caption file " + caption_name + " is not valid UTF-8");
        } else if (caption.empty()) {
            scan->rejects.emplace_back(path_string(image),
                                       "caption file " + caption_name + " is empty");
        } else {
            scan->samples.push_back({path_string(image), std::move(caption)});
        }
    }
}

// The first of `keys` that `object` holds as a string; nullptr when none does.
const nlohmann::json* string_field(const nlohmann::json& object,
                                   std::initializer_list<const char*> keys) {
    for (const char* key : keys) {
        const auto it = object.find(key);
        if (it != object.end()) return it->is_string() ? &*it : nullptr;
    }
    return nullptr;
}

void scan_manifest(const fs::path& manifest, const DatasetConfig& config, DatasetScan* scan) {
    std::error_code ec;
    if (!fs::exists(manifest, ec)) {
        throw Error::NotFound("manifest " + path_string(manifest) + " does not exist");
    }
    std::string text;
    if (!read_whole_file(manifest, &text)) {
        throw Error::IOError("cannot read manifest " + path_string(manifest));
    }
    const fs::path base = manifest.parent_path();
    std::map<std::string, size_t> first_line;  // image path -> line that listed it first
    size_t line_number = 0;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = trim(text.substr(start, end - start));
        start = end + 1;
        ++line_number;
        if (line.empty()) continue;
        const std::string source = path_string(manifest) + ":" + std::to_string(line_number);
        nlohmann::json object;
        try {
            object = storage::parse_json(line, "metadata line");
        } catch (const Error& e) {
            scan->rejects.emplace_back(source, e.message());
            continue;
        }
        if (!object.is_object()) {
            scan->rejects.emplace_back(source, "line is not a JSON object");
            continue;
        }
        const nlohmann::json* file = string_field(object, {"file", "file_name"});
        if (file == nullptr || file->get_ref<const std::string&>().empty()) {
            scan->rejects.emplace_back(source, "no \"file\" string");
            continue;
        }
        std::string caption = config.instance_prompt;
        if (caption.empty()) {
            const nlohmann::json* field =
                config.caption_column.empty()
                    ? string_field(object, {"caption", "text", "prompt"})
                    : string_field(object, {config.caption_column.c_str()});
            if (field == nullptr) {
                scan->rejects.emplace_back(
                    source, config.caption_column.empty()
                                ? std::string("no \"caption\", \"text\" or \"prompt\" string")
                                : "no \"" + config.caption_column + "\" string (--caption_column)");
                continue;
            }
            caption = field->get<std::string>();  // nlohmann has checked it is UTF-8
        }
        caption = trim(caption);
        if (caption.empty()) {
            scan->rejects.emplace_back(source, "empty caption");
            continue;
        }
        fs::path image(file->get<std::string>());
        if (image.is_relative()) image = base / image;
        image = image.lexically_normal();
        const std::string image_string = path_string(image);
        if (!fs::is_regular_file(image, ec)) {
            scan->rejects.emplace_back(source, "file not found: " + image_string);
            continue;
        }
        const auto [it, inserted] = first_line.emplace(image_string, line_number);
        if (!inserted) {
            scan->rejects.emplace_back(
                source, "duplicate of line " + std::to_string(it->second) + ": " + image_string);
            continue;
        }
        scan->samples.push_back({image_string, std::move(caption)});
    }
    std::sort(scan->samples.begin(), scan->samples.end(),
              [](const Sample& a, const Sample& b) { return a.path < b.path; });
}

}  // namespace

bool caption_from_bytes(const std::string& bytes, std::string* caption) {
    const bool has_bom = bytes.compare(0, 3, "\xEF\xBB\xBF") == 0;
    const std::string text = has_bom ? bytes.substr(3) : bytes;
    if (!valid_utf8(text)) return false;
    *caption = trim(text);
    return true;
}

DatasetScan scan_dataset(const DatasetConfig& config) {
    if (config.instance_data_dir.empty() && config.manifest.empty()) {
        throw Error::InvalidArgument("dataset: set instance_data_dir or manifest");
    }
    if (config.instance_prompt.size() > storage::schema::kMaxCaptionBytes) {
        throw Error::InvalidArgument("instance_prompt: " +
                                     caption_too_long(config.instance_prompt.size()));
    }
    DatasetScan scan;
    std::error_code ec;
    fs::path manifest(config.manifest);
    if (!config.instance_data_dir.empty()) {
        const fs::path dir(config.instance_data_dir);
        if (!fs::exists(dir, ec)) {
            throw Error::NotFound("instance_data_dir " + config.instance_data_dir +
                                  " does not exist");
        }
        if (!fs::is_directory(dir, ec)) {
            throw Error::InvalidArgument("instance_data_dir " + config.instance_data_dir +
                                         " is not a directory");
        }
        if (manifest.empty() && fs::is_regular_file(dir / "metadata.jsonl", ec)) {
            manifest = dir / "metadata.jsonl";
        }
        if (manifest.empty()) {
            scan_folder(dir, config, &scan);
            reject_unstorable(&scan);
            return scan;
        }
    }
    scan.manifest_used = path_string(manifest);
    scan_manifest(manifest, config, &scan);
    reject_unstorable(&scan);
    return scan;
}

}  // namespace sf::stages
