#include "model/gemma/tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "model/gemma/tokenizer_shim/sentencepiece_api.h"

#ifndef SANAFLOW_SENTENCEPIECE_SHIM
#define SANAFLOW_SENTENCEPIECE_SHIM "libsanaflow_sentencepiece.so"
#endif

namespace sf::model {
namespace {

// Loaded once and never unloaded: processors may live until exit.
const spm::Api& sentencepiece() {
    static const spm::Api* api = nullptr;
    static std::string failure;
    static std::once_flag once;
    std::call_once(once, [] {
        const char* env = std::getenv("SANAFLOW_SENTENCEPIECE_SHIM");
        const std::string path = env != nullptr && *env != '\0' ? env : SANAFLOW_SENTENCEPIECE_SHIM;
        // RTLD_DEEPBIND: sentencepiece must bind to its own bundled protobuf, not LibTorch's.
        void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (handle == nullptr) {
            failure = fmt::format(
                "cannot load the SentencePiece shim {} (set SANAFLOW_SENTENCEPIECE_SHIM to its "
                "path): {}",
                path, ::dlerror());
            return;
        }
        using Entry = const spm::Api* (*)();
        auto entry = reinterpret_cast<Entry>(::dlsym(handle, "sanaflow_sentencepiece_api"));
        if (entry == nullptr || entry() == nullptr ||
            entry()->version != spm::kSentencePieceApiVersion) {
            failure = fmt::format("{} is not a SentencePiece shim of version {}", path,
                                  spm::kSentencePieceApiVersion);
            return;
        }
        api = entry();
        api->adopt_streams(&std::cout, &std::cerr, &std::clog);
    });
    if (api == nullptr) throw Error::NotFound(failure);
    return *api;
}

// Sinks for the shim's results.
void to_string(void* context, const char* data, size_t size) {
    static_cast<std::string*>(context)->assign(data, size);
}
void to_ids(void* context, const int* ids, size_t count) {
    static_cast<std::vector<int>*>(context)->assign(ids, ids + count);
}

}  // namespace

struct GemmaTokenizer::Processor {
    explicit Processor(void* p) : handle(p) {}
    ~Processor() { sentencepiece().release(handle); }
    Processor(const Processor&) = delete;
    Processor& operator=(const Processor&) = delete;
    void* handle;
};

GemmaTokenizer GemmaTokenizer::from_file(const std::string& path) {
    std::filesystem::path file = path;
    if (std::filesystem::is_directory(file)) file /= "tokenizer.model";
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error::NotFound(fmt::format("cannot open tokenizer model {}", file.string()));
    std::ostringstream bytes;
    bytes << in.rdbuf();
    return from_serialized(bytes.str(), file.string());
}

GemmaTokenizer GemmaTokenizer::from_serialized(const std::string& model_proto,
                                               const std::string& name) {
    const spm::Api& api = sentencepiece();
    std::string error;
    void* handle = api.load(model_proto.data(), model_proto.size(), to_string, &error);
    if (handle == nullptr) {
        throw Error::InvalidArgument(
            fmt::format("{} is not a SentencePiece model: {}", name, error));
    }
    GemmaTokenizer t;
    t.processor_ = std::make_shared<const Processor>(handle);
    t.source_ = name;
    t.vocab_size_ = api.piece_size(handle);
    t.bos_id_ = api.special_id(handle, 0);
    t.eos_id_ = api.special_id(handle, 1);
    t.pad_id_ = api.special_id(handle, 2);
    t.unk_id_ = api.special_id(handle, 3);
    if (t.pad_id_ < 0) {
        // transformers' pad_token is "<pad>" even where the model's trainer spec names none.
        const std::string pad = "<pad>";
        const int id = api.piece_to_id(handle, pad.data(), pad.size());
        if (id >= 0 && id != t.unk_id_) t.pad_id_ = id;
    }
    return t;
}

std::vector<int> GemmaTokenizer::encode(const std::string& text, bool add_bos) const {
    std::vector<int> pieces;
    std::string error;
    if (!sentencepiece().encode(processor_->handle, text.data(), text.size(), to_ids, &pieces,
                                to_string, &error)) {
        throw Error::InvalidArgument(fmt::format("{}: cannot encode text: {}", source_, error));
    }
    if (!add_bos) return pieces;
    if (bos_id_ < 0) throw Error::InvalidArgument(source_ + " has no <bos> token");
    std::vector<int> ids;
    ids.reserve(pieces.size() + 1);
    ids.push_back(bos_id_);
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
}

std::string GemmaTokenizer::decode(const std::vector<int>& ids) const {
    for (int id : ids) {
        if (id < 0 || id >= vocab_size_) {
            throw Error::InvalidArgument(fmt::format(
                "{}: token id {} is outside the vocabulary of {}", source_, id, vocab_size_));
        }
    }
    std::string text, error;
    if (!sentencepiece().decode(processor_->handle, ids.data(), ids.size(), to_string, &text,
                                to_string, &error)) {
        throw Error::InvalidArgument(fmt::format("{}: cannot decode ids: {}", source_, error));
    }
    return text;
}

TokenBatch GemmaTokenizer::batch_encode(const std::vector<std::string>& texts,
                                        int64_t max_length) const {
    if (max_length <= 0) {
        throw Error::InvalidArgument(
            fmt::format("{}: max_length must be positive, got {}", source_, max_length));
    }
    TokenBatch out;
    out.batch = static_cast<int64_t>(texts.size());
    out.length = max_length;
    out.input_ids.reserve(texts.size() * max_length);
    out.attention_mask.reserve(texts.size() * max_length);
    for (const std::string& text : texts) {
        const std::vector<int> ids = encode(text, /*add_bos=*/true);
        const int64_t kept = std::min<int64_t>(static_cast<int64_t>(ids.size()), max_length);
        if (kept < max_length && pad_id_ < 0) {
            throw Error::InvalidArgument(source_ + " has no <pad> token to pad with");
        }
        out.input_ids.insert(out.input_ids.end(), ids.begin(), ids.begin() + kept);
        out.input_ids.insert(out.input_ids.end(), max_length - kept, pad_id_);
        out.attention_mask.insert(out.attention_mask.end(), kept, 1);
        out.attention_mask.insert(out.attention_mask.end(), max_length - kept, 0);
    }
    return out;
}

std::string GemmaTokenizer::id_to_piece(int id) const {
    if (id < 0 || id >= vocab_size_) {
        throw Error::InvalidArgument(fmt::format("{}: token id {} is outside the vocabulary of {}",
                                                 source_, id, vocab_size_));
    }
    std::string piece;
    sentencepiece().id_to_piece(processor_->handle, id, to_string, &piece);
    return piece;
}

std::string train_gemma_like_tokenizer(const std::vector<std::string>& sentences,
                                       const TokenizerTrainOptions& options) {
    if (options.model_type != "bpe" && options.model_type != "unigram") {
        throw Error::InvalidArgument(fmt::format(
            "tokenizer model_type must be bpe or unigram, got \"{}\"", options.model_type));
    }
    const std::string args = fmt::format(
        "--model_type={} --vocab_size={} --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 "
        "--pad_piece=<pad> --eos_piece=<eos> --bos_piece=<bos> --unk_piece=<unk> "
        "--add_dummy_prefix=false --normalization_rule_name=identity "
        "--remove_extra_whitespaces=false --split_digits=true --byte_fallback={} "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2",
        options.model_type, options.vocab_size, options.byte_fallback ? "true" : "false");
    std::vector<const char*> data;
    std::vector<size_t> sizes;
    for (const std::string& s : sentences) {
        data.push_back(s.data());
        sizes.push_back(s.size());
    }
    std::string model_proto, error;
    if (!sentencepiece().train(args.c_str(), data.data(), sizes.data(), data.size(), to_string,
                               &model_proto, to_string, &error)) {
        throw Error::InvalidArgument("cannot train a SentencePiece model: " + error);
    }
    return model_proto;
}

}  // namespace sf::model
