#include "stages/encode/encode_text.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "model/gemma/gemma2.h"
#include "model/gemma/text_prompt.h"
#include "model/gemma/tokenizer.h"
#include "stages/encode/resident_model.h"
#include "storage/cache.h"
#include "storage/cache_schema.h"
#include "storage/content_key.h"
#include "storage/tensor_convert.h"

namespace sf::stages {
namespace {

namespace schema = storage::schema;
constexpr const char* kStage = schema::kEncodeTextStage;

// The built-in tiny model's tokenizer: trained on this fixed text, so it is the same every run
// (and so are the cache keys). Byte fallback lets it encode any caption.
const std::vector<std::string>& builtin_tokenizer_corpus() {
    static const std::vector<std::string> corpus = [] {
        std::vector<std::string> lines;
        const char* words[] = {"a",        "the",   "red",        "green",   "blue",
                               "yellow",   "white", "black",      "circle",  "square",
                               "triangle", "on",    "background", "picture", "photo",
                               "of",       "cat",   "dog",        "house",   "tree",
                               "sky",      "with",  "and",        "in",      "number"};
        for (int i = 0; i < 400; ++i) {
            std::string line;
            for (int k = 0; k < 6; ++k) {
                if (k) line += ' ';
                line += words[(i * 7 + k * 13 + i / 5) % 25];
            }
            lines.push_back(line);
        }
        for (const auto& s : model::sana_complex_human_instruction()) lines.push_back(s);
        return lines;
    }();
    return corpus;
}

// The instruction as the fingerprint names it: "none", "sana-default", or a hash of the text.
std::string instruction_tag(const std::vector<std::string>& instruction) {
    if (instruction.empty()) return "none";
    if (instruction == model::sana_complex_human_instruction()) return "sana-default";
    std::string joined;
    for (const auto& line : instruction) joined += line + "\n";
    return "custom-" + storage::fingerprint_hash({{"text", joined}});
}

model::GemmaTokenizer load_tokenizer(const EncodeTextConfig& config) {
    if (config.model.is_pretrained())
        return model::GemmaTokenizer::from_file(config.model.component_dir("tokenizer"));
    // Big enough that the instruction (in the corpus) becomes a few hundred tokens, as with
    // Gemma's real 256k vocabulary, instead of thousands of byte tokens.
    model::TokenizerTrainOptions options;
    options.vocab_size = 1024;
    return model::GemmaTokenizer::from_serialized(
        model::train_gemma_like_tokenizer(builtin_tokenizer_corpus(), options),
        "built-in tiny tokenizer");
}

class GemmaSession final : public EncodeTextStage::Session {
public:
    GemmaSession(const EncodeTextConfig& config, c10::Device device, c10::ScalarType dtype)
        : tokenizer_(load_tokenizer(config)), encoder_(kStage, [&] {
              model::LoadOptions options;
              options.dtype = dtype;
              model::Gemma2Model m{nullptr};
              if (config.model.is_pretrained()) {
                  const std::string dir = config.model.component_dir("text_encoder");
                  m = model::Gemma2Model(model::Gemma2Config::from_json_file(dir));
                  model::load_gemma2_weights(m, dir, options);
              } else {
                  torch::manual_seed(config.model.seed);
                  auto c = model::Gemma2Config::named(config.model.builtin);
                  c.vocab_size = tokenizer_.vocab_size();
                  m = model::Gemma2Model(c);
                  m->to(dtype);
              }
              m->eval();
              if (config.offload) {
                  m->set_offload(device);  // the weights stay on the host
                  log_info(
                      "encode_text: --offload: the text encoder's layers go to {} one at a time",
                      device.str());
              } else {
                  m->to(device);
              }
              return m;
          }) {
        model::SanaPromptOptions options;
        options.max_sequence_length = config.max_length;
        options.complex_human_instruction = config.complex_human_instruction;
        prompt_ = std::make_unique<model::SanaPromptEncoder>(tokenizer_, encoder_.get(), options);
    }

    std::vector<at::Tensor> encode(const std::vector<std::string>& captions) override {
        use_torch_threads();  // OpenMP's thread count is per calling thread
        torch::NoGradGuard no_grad;
        return valid_prefixes(prompt_->encode(captions));
    }

    at::Tensor encode_empty() override {
        use_torch_threads();
        torch::NoGradGuard no_grad;
        return valid_prefixes(prompt_->encode_negative({""})).front();
    }

private:
    // The valid tokens are a prefix of the kept sequence: only those are stored.
    static std::vector<at::Tensor> valid_prefixes(
        const model::PromptEmbeddings& out) {  // [B, L, hidden], [B, L]
        std::vector<at::Tensor> features;
        for (int64_t i = 0; i < out.embeds.size(0); ++i) {
            const int64_t n = out.mask[i].sum().item<int64_t>();
            features.push_back(
                out.embeds[i].slice(0, 0, n).to(at::kCPU).contiguous());  // [n, hidden]
        }
        return features;
    }

    model::GemmaTokenizer tokenizer_;
    ResidentModel<model::Gemma2Model> encoder_;
    std::unique_ptr<model::SanaPromptEncoder> prompt_;
};

}  // namespace

EncodeTextStage::EncodeTextStage(EncodeTextConfig config) : config_(std::move(config)) {
    if (config_.batch_size < 1)
        throw Error::InvalidArgument(
            fmt::format("text batch size must be >= 1, got {}", config_.batch_size));
    if (config_.max_length < 2) throw Error::InvalidArgument("text max_length must be >= 2");
    const c10::ScalarType dtype = resolve_dtype(config_.mixed_precision);
    if (!config_.model.is_pretrained())
        model::Gemma2Config::named(config_.model.builtin);  // validates the name
    fingerprint_ = {
        {"stage", kStage},
        {"weights", weights_fingerprint(config_.model, "text_encoder")},
        {"tokenizer", config_.model.is_pretrained()
                          ? weights_fingerprint(config_.model, "tokenizer")
                          : "builtin-bpe-1024"},
        {"dtype", dtype_tag(dtype)},
        {"max_length", std::to_string(config_.max_length)},
        {"instruction", instruction_tag(config_.complex_human_instruction)},
        {"stored", "valid-prefix"},
    };
    fingerprint_hash_ = storage::fingerprint_hash(fingerprint_);
}

EncodeTextStage::~EncodeTextStage() = default;

std::string EncodeTextStage::key(const std::string& caption) const {
    return storage::content_key_of(caption, {{"text", fingerprint_hash_}});
}

std::unique_ptr<EncodeTextStage::Session> EncodeTextStage::open() const {
    return std::make_unique<GemmaSession>(config_, resolve_device(config_.device),
                                          resolve_dtype(config_.mixed_precision));
}

storage::Record EncodeTextStage::record(const at::Tensor& features,
                                        const std::string& caption) const {
    storage::Record r;
    r.tensors[schema::kPromptEmbeds] = storage::to_tensor_data(features);
    r.metadata[schema::kSource] = caption;
    r.metadata[schema::kDType] = dtype_tag(features.scalar_type());
    r.metadata[schema::kStage] = kStage;
    r.metadata[schema::kFingerprint] = fingerprint_hash_;
    r.metadata[schema::kTokens] = std::to_string(features.size(0));
    r.metadata[schema::kMaxLength] = std::to_string(config_.max_length);
    return r;
}

}  // namespace sf::stages
