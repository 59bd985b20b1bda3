#include "model/gemma/text_prompt.h"

#include <fmt/format.h>
#include <locale.h>
#include <torch/torch.h>
#include <wctype.h>

#include "core/error.h"

namespace sf::model {
namespace {

// UTF-8 -> code points. A byte that does not start a valid sequence is kept as a marker above
// the Unicode range and written back unchanged, so malformed input passes through as it came.
constexpr char32_t kRawByte = 0x110000;

std::u32string decode_utf8(const std::string& s) {
    std::u32string out;
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        const int extra = c < 0x80           ? 0
                          : (c >> 5) == 0x6  ? 1
                          : (c >> 4) == 0xE  ? 2
                          : (c >> 3) == 0x1E ? 3
                                             : -1;
        char32_t cp = extra == 0   ? c
                      : extra == 1 ? (c & 0x1F)
                      : extra == 2 ? (c & 0x0F)
                                   : (c & 0x07);
        bool ok = extra >= 0 && i + extra < s.size();
        for (int k = 1; ok && k <= extra; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            ok = (cc >> 6) == 0x2;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if (!ok) {
            out.push_back(kRawByte + c);
            ++i;
            continue;
        }
        out.push_back(cp);
        i += extra + 1;
    }
    return out;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp >= kRawByte) {
        out.push_back(static_cast<char>(cp - kRawByte));
    } else if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// Python's str.isspace(): Unicode White_Space plus the separators U+001C..U+001F.
bool python_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

// glibc's C.UTF-8 carries the Unicode case tables; its own thread-safe locale object, so the
// process locale is untouched.
locale_t utf8_locale() {
    static const locale_t locale = [] {
        locale_t l = ::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
        return l;
    }();
    return locale;
}

char32_t simple_lower(char32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= kRawByte) return c;
    const locale_t l = utf8_locale();
    if (l == static_cast<locale_t>(nullptr)) return c;
    return static_cast<char32_t>(::towlower_l(static_cast<wint_t>(c), l));
}

bool is_cased_letter(char32_t c) {
    if (c >= kRawByte) return false;
    if (c < 0x80) return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    const locale_t l = utf8_locale();
    return l != static_cast<locale_t>(nullptr) &&
           (::iswupper_l(static_cast<wint_t>(c), l) || ::iswlower_l(static_cast<wint_t>(c), l));
}

}  // namespace

const std::vector<std::string>& sana_complex_human_instruction() {
    // diffusers v0.33.1 SanaPipeline.__call__'s default, verbatim (it is part of the features:
    // changing a character changes every embedding).
    static const std::vector<std::string> kInstruction = {
        "Given a user prompt, generate an 'Enhanced prompt' that provides detailed visual "
        "descriptions suitable for image generation. Evaluate the level of detail in the user "
        "prompt:",
        "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, "
        "textures, and spatial relationships to create vivid and concrete scenes.",
        "- If the prompt is already detailed, refine and enhance the existing details slightly "
        "without overcomplicating.",
        "Here are examples of how to transform or refine prompts:",
        "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round "
        "shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red "
        "flowers.",
        "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, "
        "featuring glowing street lamps, a diverse crowd of people in colorful clothing, and a "
        "double-decker bus passing by towering glass skyscrapers.",
        "Please generate only the enhanced description for the prompt below and avoid including "
        "any additional commentary or evaluations:",
        "User Prompt: ",
    };
    return kInstruction;
}

std::string sana_preprocess_prompt(const std::string& prompt) {
    const std::u32string cps = decode_utf8(prompt);
    size_t begin = 0, end = cps.size();
    while (begin < end && python_space(cps[begin])) ++begin;
    while (end > begin && python_space(cps[end - 1])) --end;
    std::string out;
    out.reserve(prompt.size());
    for (size_t i = begin; i < end; ++i) {
        const char32_t c = cps[i];
        if (c == 0x0130) {  // 'İ' lower-cases to "i̇" in full case mapping
            append_utf8(out, U'i');
            append_utf8(out, 0x0307);
        } else if (c == 0x03A3) {
            // Python's Final_Sigma: 'Σ' after a cased letter and not before one becomes 'ς'.
            const bool after = i > 0 && is_cased_letter(cps[i - 1]);
            const bool before = i + 1 < cps.size() && is_cased_letter(cps[i + 1]);
            append_utf8(out, after && !before ? 0x03C2 : 0x03C3);
        } else {
            append_utf8(out, simple_lower(c));
        }
    }
    return out;
}

std::vector<int64_t> sana_select_index(int64_t total_length, int64_t max_sequence_length) {
    if (max_sequence_length <= 0) {
        throw Error::InvalidArgument(
            fmt::format("max_sequence_length must be positive, got {}", max_sequence_length));
    }
    // Python's negative indices -1 .. -(N - 1) must exist.
    if (total_length < max_sequence_length - 1 || total_length <= 0) {
        throw Error::InvalidArgument(fmt::format("cannot keep the last {} of {} tokens",
                                                 max_sequence_length - 1, total_length));
    }
    std::vector<int64_t> index = {0};
    for (int64_t k = max_sequence_length - 1; k >= 1; --k) index.push_back(total_length - k);
    return index;
}

std::pair<torch::Tensor, torch::Tensor> token_tensors(const TokenBatch& tokens) {
    const auto options = torch::TensorOptions().dtype(torch::kLong);
    // [B * L] -> [B, L]
    torch::Tensor ids =
        torch::tensor(tokens.input_ids, options).view({tokens.batch, tokens.length});
    torch::Tensor mask =
        torch::tensor(tokens.attention_mask, options).view({tokens.batch, tokens.length});
    return {ids, mask};
}

SanaPromptEncoder::SanaPromptEncoder(GemmaTokenizer tokenizer, Gemma2Model encoder,
                                     SanaPromptOptions options)
    : tokenizer_(std::move(tokenizer)), encoder_(std::move(encoder)), options_(std::move(options)) {
    if (options_.max_sequence_length <= 0) {
        throw Error::InvalidArgument(fmt::format("max_sequence_length must be positive, got {}",
                                                 options_.max_sequence_length));
    }
    if (tokenizer_.vocab_size() > encoder_->config().vocab_size) {
        throw Error::InvalidArgument(fmt::format(
            "tokenizer {} has {} tokens, more than the text encoder's vocabulary of {}",
            tokenizer_.source(), tokenizer_.vocab_size(), encoder_->config().vocab_size));
    }
}

SanaPromptTokens SanaPromptEncoder::tokenize(const std::vector<std::string>& prompts) const {
    SanaPromptTokens out;
    int64_t total_length = options_.max_sequence_length;
    std::string instruction;
    // As upstream's `if not complex_human_instruction`: only an empty list means none.
    const bool instructed = !options_.complex_human_instruction.empty();
    if (instructed) {
        for (size_t i = 0; i < options_.complex_human_instruction.size(); ++i) {
            if (i > 0) instruction += "\n";
            instruction += options_.complex_human_instruction[i];
        }
        out.instruction_tokens = static_cast<int64_t>(tokenizer_.encode(instruction).size());
        total_length = out.instruction_tokens + options_.max_sequence_length - 2;
    }
    std::vector<std::string> texts;
    texts.reserve(prompts.size());
    for (const std::string& p : prompts) {
        texts.push_back(instruction + (options_.preprocess ? sana_preprocess_prompt(p) : p));
    }
    out.tokens = tokenizer_.batch_encode(texts, total_length);
    out.select_index = sana_select_index(total_length, options_.max_sequence_length);
    return out;
}

torch::Tensor SanaPromptEncoder::run(const TokenBatch& tokens, torch::Tensor* mask) const {
    if (tokens.batch == 0) throw Error::InvalidArgument("no prompts to encode");
    auto [ids, attention] = token_tensors(tokens);
    const torch::Device device = encoder_->embed_tokens->weight.device();
    ids = ids.to(device);
    attention = attention.to(device);
    torch::NoGradGuard no_grad;
    *mask = attention;
    return encoder_.ptr()->forward(ids, attention);  // [B, L, hidden]
}

PromptEmbeddings SanaPromptEncoder::encode(const std::vector<std::string>& prompts) const {
    const SanaPromptTokens t = tokenize(prompts);
    torch::Tensor mask;
    const torch::Tensor hidden = run(t.tokens, &mask);
    const torch::Tensor index =
        torch::tensor(t.select_index, torch::TensorOptions().dtype(torch::kLong))
            .to(hidden.device());
    PromptEmbeddings out;
    out.embeds = hidden.index_select(1, index);  // [B, L, hidden] -> [B, N, hidden]
    out.mask = mask.index_select(1, index);      // [B, L] -> [B, N]
    return out;
}

PromptEmbeddings SanaPromptEncoder::encode_negative(const std::vector<std::string>& prompts) const {
    std::vector<std::string> texts;
    texts.reserve(prompts.size());
    for (const std::string& p : prompts)
        texts.push_back(options_.preprocess ? sana_preprocess_prompt(p) : p);
    const TokenBatch tokens = tokenizer_.batch_encode(texts, options_.max_sequence_length);
    PromptEmbeddings out;
    out.embeds = run(tokens, &out.mask);  // [B, N, hidden]
    return out;
}

}  // namespace sf::model
