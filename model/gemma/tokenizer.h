// The Gemma tokenizer: SentencePiece (`tokenizer/tokenizer.model`) with transformers'
// GemmaTokenizer conventions: <bos> prepended (add_bos_token), no <eos>, padding on the right with
// <pad>, truncation on the right. Torch-free: a stage can tokenize without LibTorch.
//
// SentencePiece runs inside libsanaflow_sentencepiece.so, loaded on first use (see
// model/tokenizer_shim/sentencepiece_api.h for why); SANAFLOW_SENTENCEPIECE_SHIM overrides where
// it is looked for.
//
// What it does not do: transformers splits added special tokens written in the text ("<bos>",
// "<start_of_turn>") before SentencePiece sees it; here SentencePiece alone segments the text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sf::model {

// Rows of token ids, padded to one length.
struct TokenBatch {
    int64_t batch = 0;
    int64_t length = 0;
    std::vector<int64_t> input_ids;       // [batch, length], row-major
    std::vector<int64_t> attention_mask;  // [batch, length]: 1 token, 0 padding
};

class GemmaTokenizer {
public:
    // `path` is a tokenizer.model file or a directory holding one (a diffusers `tokenizer/`).
    // kNotFound for a missing file, kInvalidArgument for one SentencePiece cannot read.
    static GemmaTokenizer from_file(const std::string& path);
    // A serialized SentencePiece ModelProto (the bytes of a tokenizer.model); `name` for errors.
    static GemmaTokenizer from_serialized(const std::string& model_proto,
                                          const std::string& name = "<memory>");

    // The ids of `text`, <bos> first when `add_bos` (as tokenizer.encode(text)).
    std::vector<int> encode(const std::string& text, bool add_bos = true) const;
    // The text of `ids`; control tokens (<bos>, <eos>, <pad>) decode to nothing.
    std::string decode(const std::vector<int>& ids) const;
    // As transformers' tokenizer(texts, padding="max_length", max_length=max_length,
    // truncation=True): <bos> + tokens, the first max_length kept, then <pad> up to max_length.
    TokenBatch batch_encode(const std::vector<std::string>& texts, int64_t max_length) const;

    int vocab_size() const { return vocab_size_; }
    int bos_id() const { return bos_id_; }
    int eos_id() const { return eos_id_; }
    int pad_id() const { return pad_id_; }  // -1 when the model has no <pad>
    int unk_id() const { return unk_id_; }
    std::string id_to_piece(int id) const;
    const std::string& source() const { return source_; }

private:
    struct Processor;
    GemmaTokenizer() = default;

    std::shared_ptr<const Processor> processor_;
    std::string source_;
    int vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
};

struct TokenizerTrainOptions {
    std::string model_type = "bpe";  // or "unigram"
    int vocab_size = 320;            // byte fallback alone takes 256 + 4 special ids
    bool byte_fallback = true;
};

// Trains a SentencePiece model laid out like Gemma's: <pad> 0, <eos> 1, <bos> 2, <unk> 3, no
// dummy prefix, identity normalization, split digits, byte fallback, full character coverage.
// Returns the serialized model: what from_serialized takes and a tokenizer.model file holds.
// For tests and the tiny demo; a few hundred short sentences train in well under a second.
std::string train_gemma_like_tokenizer(const std::vector<std::string>& sentences,
                                       const TokenizerTrainOptions& options = {});

}  // namespace sf::model
