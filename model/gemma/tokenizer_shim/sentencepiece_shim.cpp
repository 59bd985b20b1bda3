// libsanaflow_sentencepiece.so: the SentencePiece library behind a C function table, loaded by
// model/tokenizer.cpp with RTLD_DEEPBIND (see sentencepiece_api.h for why).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "model/gemma/tokenizer_shim/sentencepiece_api.h"

// Exported by libsentencepiece, declared only in its private headers. Level 0 info, 1 warning,
// 2 error.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

namespace {

using sentencepiece::SentencePieceProcessor;
using sf::model::spm::BytesSink;
using sf::model::spm::IdsSink;

const SentencePieceProcessor& cast(const void* p) {
    return *static_cast<const SentencePieceProcessor*>(p);
}

bool report(const sentencepiece::util::Status& status, BytesSink error, void* context) {
    if (status.ok()) return true;
    const std::string text = status.ToString();
    error(context, text.data(), text.size());
    return false;
}

// libstdc++'s own std::cout / cerr / clog, as sentencepiece sees them, made to write where the
// program's do (see Api::adopt_streams).
void adopt_streams(void* cout_stream, void* cerr_stream, void* clog_stream) {
    const std::pair<std::ostream*, void*> pairs[] = {
        {&std::cout, cout_stream}, {&std::cerr, cerr_stream}, {&std::clog, clog_stream}};
    for (const auto& [mine, theirs] : pairs) {
        if (theirs == nullptr || static_cast<void*>(mine) == theirs) continue;
        const auto* program = static_cast<const std::ostream*>(theirs);
        auto* stream = new (mine) std::ostream(program->rdbuf());
        stream->flags(program->flags());
        stream->tie(program->tie());
    }
}

void* load(const char* data, size_t size, BytesSink error, void* context) {
    auto sp = std::make_unique<SentencePieceProcessor>();
    if (!report(sp->LoadFromSerializedProto(std::string(data, size)), error, context))
        return nullptr;
    return sp.release();
}

void release(void* p) { delete static_cast<SentencePieceProcessor*>(p); }

bool encode(const void* p, const char* text, size_t size, IdsSink ids, void* ids_context,
            BytesSink error, void* error_context) {
    std::vector<int> out;
    if (!report(cast(p).Encode(std::string(text, size), &out), error, error_context)) return false;
    ids(ids_context, out.data(), out.size());
    return true;
}

bool decode(const void* p, const int* ids, size_t count, BytesSink text, void* text_context,
            BytesSink error, void* error_context) {
    std::string out;
    if (!report(cast(p).Decode(std::vector<int>(ids, ids + count), &out), error, error_context)) {
        return false;
    }
    text(text_context, out.data(), out.size());
    return true;
}

int piece_size(const void* p) { return cast(p).GetPieceSize(); }

int special_id(const void* p, int which) {
    switch (which) {
        case 0:
            return cast(p).bos_id();
        case 1:
            return cast(p).eos_id();
        case 2:
            return cast(p).pad_id();
        case 3:
            return cast(p).unk_id();
    }
    return -1;
}

int piece_to_id(const void* p, const char* piece, size_t size) {
    return cast(p).PieceToId(std::string(piece, size));
}

void id_to_piece(const void* p, int id, BytesSink piece, void* context) {
    const std::string& out = cast(p).IdToPiece(id);
    piece(context, out.data(), out.size());
}

class VectorIterator : public sentencepiece::SentenceIterator {
public:
    explicit VectorIterator(std::vector<std::string> sentences)
        : sentences_(std::move(sentences)) {}
    bool done() const override { return index_ >= sentences_.size(); }
    void Next() override { ++index_; }
    const std::string& value() const override { return sentences_[index_]; }
    sentencepiece::util::Status status() const override { return {}; }

private:
    std::vector<std::string> sentences_;
    size_t index_ = 0;
};

bool train(const char* args, const char* const* sentences, const size_t* sizes, size_t count,
           BytesSink model, void* model_context, BytesSink error, void* error_context) {
    std::vector<std::string> copy;
    copy.reserve(count);
    for (size_t i = 0; i < count; ++i) copy.emplace_back(sentences[i], sizes[i]);
    VectorIterator it(std::move(copy));
    // Training logs its whole configuration and progress at info level, before it even parses
    // --minloglevel.
    sentencepiece::logging::SetMinLogLevel(2);
    std::string proto;
    if (!report(sentencepiece::SentencePieceTrainer::Train(args, &it, &proto), error,
                error_context)) {
        return false;
    }
    model(model_context, proto.data(), proto.size());
    return true;
}

constexpr sf::model::spm::Api kApi = {
    sf::model::spm::kSentencePieceApiVersion,
    adopt_streams,
    load,
    release,
    encode,
    decode,
    piece_size,
    special_id,
    piece_to_id,
    id_to_piece,
    train,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const sf::model::spm::Api*
sanaflow_sentencepiece_api() {
    return &kApi;
}
