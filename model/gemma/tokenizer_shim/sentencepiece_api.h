// The function table of the SentencePiece shim (libsanaflow_sentencepiece.so), shared by the shim
// and model/tokenizer.cpp. Private to the tokenizer: nothing else includes it.
//
// Why a shim: Debian's libsentencepiece carries its own protobuf-lite 3.14 and exports it, while
// LibTorch links the system libprotobuf 3.21. Linked into one program, the dynamic linker binds
// libprotobuf's start-up code to sentencepiece's copy and the program crashes before main. The
// shim is loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND): sentencepiece then binds to its own
// protobuf and stays out of the global symbol scope.
//
// Only C types cross the table: the shim is built with the system's default libstdc++ ABI (as
// libsentencepiece is), the caller with LibTorch's, and those may differ (_GLIBCXX_USE_CXX11_ABI).
// Results come back through sinks the caller provides. Bump kSentencePieceApiVersion on any change.
#pragma once

#include <cstddef>

namespace sf::model::spm {

constexpr int kSentencePieceApiVersion = 3;

// Receives bytes (a string) or, for ids, `size` ints at `data`.
using BytesSink = void (*)(void* context, const char* data, size_t size);
using IdsSink = void (*)(void* context, const int* ids, size_t count);

struct Api {
    int version;
    // Call once after loading, with the caller's &std::cout, &std::cerr, &std::clog. A program's
    // standard streams live in the executable (copy relocations); under RTLD_DEEPBIND
    // sentencepiece would bind to libstdc++'s own never-constructed copies and crash on its first
    // log line. The shim constructs those copies over the caller's stream buffers.
    void (*adopt_streams)(void* cout_stream, void* cerr_stream, void* clog_stream);
    // A processor from a serialized ModelProto; nullptr with the error sent to `error`.
    void* (*load)(const char* model_proto, size_t size, BytesSink error, void* error_context);
    void (*release)(void* processor);
    bool (*encode)(const void* processor, const char* text, size_t size, IdsSink ids,
                   void* ids_context, BytesSink error, void* error_context);
    bool (*decode)(const void* processor, const int* ids, size_t count, BytesSink text,
                   void* text_context, BytesSink error, void* error_context);
    int (*piece_size)(const void* processor);
    // Which: 0 bos, 1 eos, 2 pad, 3 unk (-1 when the model has none).
    int (*special_id)(const void* processor, int which);
    int (*piece_to_id)(const void* processor, const char* piece, size_t size);
    void (*id_to_piece)(const void* processor, int id, BytesSink piece, void* piece_context);
    // SentencePieceTrainer::Train(args) on `count` sentences; the serialized model to `model`.
    bool (*train)(const char* args, const char* const* sentences, const size_t* sizes, size_t count,
                  BytesSink model, void* model_context, BytesSink error, void* error_context);
};

}  // namespace sf::model::spm

// The one exported symbol of the shim.
extern "C" const sf::model::spm::Api* sanaflow_sentencepiece_api();
