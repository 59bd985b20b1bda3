// Sana's caption features, as diffusers v0.33.1 SanaPipeline.encode_prompt computes them: the
// prompt lower-cased and stripped, the "complex human instruction" prepended, tokenized and
// right-padded to (instruction tokens + max_sequence_length - 2), run through Gemma-2, then the
// first token (<bos>) and the last max_sequence_length - 1 positions kept. The negative prompt
// ("" for classifier-free guidance) gets no instruction and no selection: max_sequence_length
// tokens straight.
//
// Not done: diffusers' clean_caption=True path (BeautifulSoup, ftfy and some forty regexes); this
// is its clean_caption=False path, the one Sana's training code uses.
#pragma once

#include <string>
#include <vector>

#include "model/gemma/gemma2.h"
#include "model/gemma/tokenizer.h"

namespace sf::model {

// diffusers' default `complex_human_instruction`, one list entry per string. Upstream joins them
// with "\n" and puts the prompt straight after the last one ("User Prompt: ").
const std::vector<std::string>& sana_complex_human_instruction();

// Python's prompt.lower().strip() on UTF-8 text: Unicode lower case (simple mappings, plus 'İ' and
// the final sigma as Python does them) and Python's whitespace set stripped at both ends.
std::string sana_preprocess_prompt(const std::string& prompt);

// [0] + list(range(-max_sequence_length + 1, 0)) over a sequence of `total_length`, as absolute
// positions: 0, then total_length - max_sequence_length + 1 ... total_length - 1.
std::vector<int64_t> sana_select_index(int64_t total_length, int64_t max_sequence_length);

// input_ids and attention_mask [batch, length] int64 CPU tensors of a batch.
std::pair<torch::Tensor, torch::Tensor> token_tensors(const TokenBatch& tokens);

struct SanaPromptOptions {
    int64_t max_sequence_length = 300;
    // Joined with "\n" and prepended to each prompt; an empty list means no instruction.
    std::vector<std::string> complex_human_instruction = sana_complex_human_instruction();
    // The clean_caption=False preprocessing (lower-case, strip). Off: prompts are used as given.
    bool preprocess = true;
};

// What goes into the encoder for a batch of prompts, and which positions come out.
struct SanaPromptTokens {
    TokenBatch tokens;                  // [B, total_length]
    std::vector<int64_t> select_index;  // max_sequence_length positions into total_length
    int64_t instruction_tokens = 0;     // len(tokenizer.encode(instruction)), <bos> included
};

struct PromptEmbeddings {
    torch::Tensor embeds;  // [B, max_sequence_length, hidden], the encoder's dtype and device
    torch::Tensor mask;    // [B, max_sequence_length] int64: 1 token, 0 padding
};

class SanaPromptEncoder {
public:
    SanaPromptEncoder(GemmaTokenizer tokenizer, Gemma2Model encoder,
                      SanaPromptOptions options = {});

    SanaPromptTokens tokenize(const std::vector<std::string>& prompts) const;
    // The prompt embeddings Sana's transformer takes as encoder_hidden_states. No gradients.
    PromptEmbeddings encode(const std::vector<std::string>& prompts) const;
    // The unconditional embeddings: each prompt (normally "") without the instruction, padded to
    // max_sequence_length, every position kept.
    PromptEmbeddings encode_negative(const std::vector<std::string>& prompts = {""}) const;

    const GemmaTokenizer& tokenizer() const { return tokenizer_; }
    const Gemma2Model& encoder() const { return encoder_; }
    const SanaPromptOptions& options() const { return options_; }

private:
    torch::Tensor run(const TokenBatch& tokens, torch::Tensor* mask) const;

    GemmaTokenizer tokenizer_;
    Gemma2Model encoder_;
    SanaPromptOptions options_;
};

}  // namespace sf::model
