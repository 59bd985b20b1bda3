// The Gemma tokenizer wrapper (on a SentencePiece model trained here, laid out like Gemma's) and
// Sana's prompt handling: preprocessing, the complex human instruction, the padded length, the
// first-plus-last-299 selection and the negative prompt, with the tiny Gemma-2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "model/gemma/gemma2.h"
#include "model/gemma/text_prompt.h"
#include "model/gemma/tokenizer.h"
#include "test_util.h"

namespace {

using sf::test::error_of;

using sf::model::GemmaTokenizer;

std::vector<std::string> toy_corpus() {
    const std::vector<std::string> words = {
        "a",     "cat",    "sleeping", "on",    "the",    "red",   "sofa",  "dog",      "running",
        "in",    "park",   "blue",     "sky",   "über",   "café",  "猫",    "🙂",     "with",
        "green", "trees",  "small",    "white", "street", "city",  "bus",   "glass",    "prompt",
        "user",  "detail", "colors",   "shape", "light",  "night", "river", "mountain", "2024"};
    std::vector<std::string> corpus;
    uint32_t state = 12345;
    for (int i = 0; i < 600; ++i) {
        std::string line;
        for (int j = 0; j < 10; ++j) {
            state = state * 1103515245u + 12345u;
            if (j > 0) line += (state >> 30) == 0 ? ", " : " ";
            line += words[(state >> 16) % words.size()];
        }
        corpus.push_back(line);
    }
    for (const auto& s : sf::model::sana_complex_human_instruction()) corpus.push_back(s);
    return corpus;
}

// Trained once per test binary (about 0.1 s).
const std::string& toy_model_proto() {
    static const std::string proto = sf::model::train_gemma_like_tokenizer(toy_corpus());
    return proto;
}

GemmaTokenizer toy_tokenizer() {
    return GemmaTokenizer::from_serialized(toy_model_proto(), "toy.model");
}

TEST(GemmaTokenizer, SpecialIdsAreGemmas) {
    const auto t = toy_tokenizer();
    EXPECT_EQ(t.pad_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.bos_id(), 2);
    EXPECT_EQ(t.unk_id(), 3);
    EXPECT_EQ(t.vocab_size(), 320);
    EXPECT_EQ(t.id_to_piece(2), "<bos>");
    EXPECT_EQ(t.id_to_piece(0), "<pad>");
}

TEST(GemmaTokenizer, PrependsBosAndNoEos) {
    const auto t = toy_tokenizer();
    const auto ids = t.encode("a cat sleeping on the red sofa");
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 2);
    EXPECT_NE(ids.back(), 1);
    const auto bare = t.encode("a cat sleeping on the red sofa", /*add_bos=*/false);
    EXPECT_EQ(std::vector<int>(ids.begin() + 1, ids.end()), bare);
    EXPECT_EQ(t.encode(""), std::vector<int>{2});
    // No dummy prefix, as Gemma: "cat" alone and " cat" differ.
    EXPECT_NE(t.encode("cat", false), t.encode(" cat", false));
}

TEST(GemmaTokenizer, RoundTripsUnicodeThroughByteFallback) {
    const auto t = toy_tokenizer();
    for (const std::string text :
         {"a cat über the café", "猫 🙂 on the sofa", "Zebra ǅ ∑ 漢字 — x",
          "  two  spaces\tand\nnewline ", "digits 12345"}) {
        const auto ids = t.encode(text);
        EXPECT_EQ(t.decode(ids), text) << text;  // <bos> decodes to nothing
    }
    // Unseen characters become byte pieces, not <unk>.
    const auto ids = t.encode("ǅ", false);
    EXPECT_EQ(ids.size(), 2u);  // two UTF-8 bytes
    for (int id : ids) EXPECT_EQ(t.id_to_piece(id).rfind("<0x", 0), 0u) << t.id_to_piece(id);
    // Digits are split one by one.
    EXPECT_EQ(t.encode("2024", false).size(), 4u);
}

TEST(GemmaTokenizer, PadsRightTruncatesAndMasks) {
    const auto t = toy_tokenizer();
    const auto short_ids = t.encode("a cat");
    const auto long_ids = t.encode("a small white cat sleeping on the red sofa in the park");
    const int64_t max_length = static_cast<int64_t>(short_ids.size()) + 3;
    ASSERT_GT(static_cast<int64_t>(long_ids.size()), max_length);
    const auto batch = t.batch_encode(
        {"a cat", "a small white cat sleeping on the red sofa in the park", ""}, max_length);
    ASSERT_EQ(batch.batch, 3);
    ASSERT_EQ(batch.length, max_length);
    ASSERT_EQ(batch.input_ids.size(), static_cast<size_t>(3 * max_length));
    auto row = [&](const std::vector<int64_t>& v, int r) {
        return std::vector<int64_t>(v.begin() + r * max_length, v.begin() + (r + 1) * max_length);
    };
    std::vector<int64_t> expect(short_ids.begin(), short_ids.end());
    expect.insert(expect.end(), 3, 0);
    EXPECT_EQ(row(batch.input_ids, 0), expect);
    std::vector<int64_t> mask(short_ids.size(), 1);
    mask.insert(mask.end(), 3, 0);
    EXPECT_EQ(row(batch.attention_mask, 0), mask);
    // Truncated on the right: <bos> and the first tokens stay.
    EXPECT_EQ(row(batch.input_ids, 1),
              std::vector<int64_t>(long_ids.begin(), long_ids.begin() + max_length));
    EXPECT_EQ(row(batch.attention_mask, 1), std::vector<int64_t>(max_length, 1));
    // The empty prompt is <bos> then padding.
    std::vector<int64_t> empty(max_length, 0);
    empty[0] = 2;
    EXPECT_EQ(row(batch.input_ids, 2), empty);
    EXPECT_EQ(row(batch.attention_mask, 2)[0], 1);
    EXPECT_EQ(row(batch.attention_mask, 2)[1], 0);
    EXPECT_NE(error_of([&] { t.batch_encode({"x"}, 0); }).find("max_length"), std::string::npos);
}

TEST(GemmaTokenizer, LoadsAFileOrDirectoryAndNamesBadOnes) {
    sf::test::TempDir tmp("sf_tok");
    sf::test::write_file(tmp.path() / "tokenizer" / "tokenizer.model", toy_model_proto());
    const auto from_dir = GemmaTokenizer::from_file(tmp.file("tokenizer"));
    EXPECT_EQ(from_dir.encode("a red cat"), toy_tokenizer().encode("a red cat"));
    EXPECT_NE(from_dir.source().find("tokenizer.model"), std::string::npos);
    const std::string missing = error_of([&] { GemmaTokenizer::from_file(tmp.file("nowhere")); });
    EXPECT_NE(missing.find("nowhere"), std::string::npos) << missing;
    sf::test::write_file(tmp.path() / "bad.model", "this is not a protobuf");
    const std::string bad = error_of([&] { GemmaTokenizer::from_file(tmp.file("bad.model")); });
    EXPECT_NE(bad.find("bad.model"), std::string::npos) << bad;
    EXPECT_NE(error_of([&] { toy_tokenizer().decode({5000}); }).find("5000"), std::string::npos);
}

TEST(SanaPrompt, PreprocessesLikePythonLowerStrip) {
    using sf::model::sana_preprocess_prompt;
    EXPECT_EQ(sana_preprocess_prompt("  A Cat ON a Sofa\t\n"), "a cat on a sofa");
    EXPECT_EQ(sana_preprocess_prompt("ÄÖÜ École ΑΒΓ"), "äöü école αβγ");
    EXPECT_EQ(sana_preprocess_prompt("ΟΔΟΣ ΣΑ"), "οδος σα");  // final sigma
    EXPECT_EQ(sana_preprocess_prompt("İ"), "i\u0307");
    EXPECT_EQ(sana_preprocess_prompt("\u00a0\u3000猫\u2003"), "猫");  // NBSP, ideographic, em space
    EXPECT_EQ(sana_preprocess_prompt("  "), "");
    EXPECT_EQ(sana_preprocess_prompt("bad \xff byte"), "bad \xff byte");
}

TEST(SanaPrompt, DefaultInstructionIsDiffusers) {
    const auto& chi = sf::model::sana_complex_human_instruction();
    ASSERT_EQ(chi.size(), 8u);
    EXPECT_EQ(chi.front().rfind("Given a user prompt, generate an 'Enhanced prompt'", 0), 0u);
    EXPECT_EQ(chi[4].size(), 188u);
    std::string joined;
    for (const auto& s : chi) joined += (joined.empty() ? "" : "\n") + s;
    EXPECT_EQ(joined.size(), 1057u);  // len("\n".join(complex_human_instruction)) upstream
    EXPECT_EQ(chi.back(), "User Prompt: ");
}

TEST(SanaPrompt, SelectIndexIsFirstPlusLast) {
    EXPECT_EQ(sf::model::sana_select_index(10, 4), (std::vector<int64_t>{0, 7, 8, 9}));
    const auto identity = sf::model::sana_select_index(300, 300);
    ASSERT_EQ(identity.size(), 300u);
    for (int64_t i = 0; i < 300; ++i) EXPECT_EQ(identity[i], i);
    EXPECT_NE(error_of([] { sf::model::sana_select_index(5, 10); }).find("last 9 of 5"),
              std::string::npos);
}

class SanaPromptEncoderTest : public ::testing::Test {
protected:
    void SetUp() override {
        torch::manual_seed(7);
        model_ = sf::model::Gemma2Model(sf::model::Gemma2Config::named("gemma-2-tiny"));
        model_->eval();
    }
    sf::model::Gemma2Model model_{nullptr};
};

TEST_F(SanaPromptEncoderTest, DefaultInstructionLengthAndSelection) {
    const auto tok = toy_tokenizer();
    sf::model::SanaPromptEncoder enc(tok, model_);
    std::string instruction;
    for (const auto& s : sf::model::sana_complex_human_instruction()) {
        instruction += (instruction.empty() ? "" : "\n") + s;
    }
    const int64_t n_chi = static_cast<int64_t>(tok.encode(instruction).size());

    const auto t = enc.tokenize({"  A Cat sleeping "});
    EXPECT_EQ(t.instruction_tokens, n_chi);
    EXPECT_EQ(t.tokens.length, n_chi + 300 - 2);
    ASSERT_EQ(t.select_index.size(), 300u);
    EXPECT_EQ(t.select_index[0], 0);
    EXPECT_EQ(t.select_index[1], n_chi - 1);
    EXPECT_EQ(t.select_index.back(), t.tokens.length - 1);
    // The encoder sees <bos> + instruction + the preprocessed prompt, then padding.
    const auto full = tok.encode(instruction + "a cat sleeping");
    const auto row = t.tokens.input_ids;
    EXPECT_EQ(std::vector<int64_t>(row.begin(), row.begin() + full.size()),
              std::vector<int64_t>(full.begin(), full.end()));
    EXPECT_EQ(row[full.size()], 0);

    // One forward at the real length (about 300 + the instruction's tokens).
    const auto out = enc.encode({"  A Cat sleeping "});
    EXPECT_EQ(out.embeds.sizes(), (std::vector<int64_t>{1, 300, 48}));
    EXPECT_EQ(out.mask.sizes(), (std::vector<int64_t>{1, 300}));
    EXPECT_EQ(out.mask.scalar_type(), torch::kLong);
    // <bos> plus every real token from position n_chi - 1 on.
    const int64_t real = static_cast<int64_t>(full.size());
    EXPECT_EQ(out.mask.sum().item<int64_t>(), 1 + real - (n_chi - 1));
    EXPECT_EQ(out.mask[0][0].item<int64_t>(), 1);
    EXPECT_EQ(out.mask[0][299].item<int64_t>(), 0);
}

// A short instruction and length: the same arithmetic at a tenth of the cost.
sf::model::SanaPromptOptions short_options() {
    sf::model::SanaPromptOptions o;
    o.max_sequence_length = 24;
    o.complex_human_instruction = {"Describe the scene in detail:", "User Prompt: "};
    return o;
}

TEST_F(SanaPromptEncoderTest, EmbeddingsArePickedFromTheWholeSequence) {
    sf::model::SanaPromptEncoder enc(toy_tokenizer(), model_, short_options());
    const auto t = enc.tokenize({"a dog in the park", "a cat"});
    EXPECT_EQ(t.tokens.length, t.instruction_tokens + 24 - 2);
    const auto out = enc.encode({"a dog in the park", "a cat"});
    auto [ids, mask] = sf::model::token_tensors(t.tokens);
    torch::NoGradGuard no_grad;
    const auto hidden = model_->forward(ids, mask);
    const auto index = torch::tensor(t.select_index, torch::kLong);
    EXPECT_TRUE(torch::equal(out.embeds, hidden.index_select(1, index)));
    EXPECT_TRUE(torch::equal(out.mask, mask.index_select(1, index)));
    // Each row as it would be alone.
    const auto alone = enc.encode({"a cat"});
    EXPECT_TRUE(torch::allclose(alone.embeds[0], out.embeds[1], 1e-5, 1e-6));
    EXPECT_TRUE(torch::equal(alone.mask[0], out.mask[1]));
}

TEST_F(SanaPromptEncoderTest, LongPromptsAndTheNegativePrompt) {
    const auto tok = toy_tokenizer();
    sf::model::SanaPromptEncoder enc(tok, model_, short_options());
    std::string long_prompt;
    for (int i = 0; i < 40; ++i) long_prompt += "a red cat on the blue sofa ";
    const auto out = enc.encode({long_prompt});
    EXPECT_EQ(out.embeds.sizes(), (std::vector<int64_t>{1, 24, 48}));
    EXPECT_EQ(out.mask.sum().item<int64_t>(), 24);  // truncated: every kept position is real

    // Classifier-free guidance's "": <bos> then pads, no instruction, every position kept, at the
    // default length.
    sf::model::SanaPromptEncoder full(tok, model_);
    const auto neg = full.encode_negative();
    EXPECT_EQ(neg.embeds.sizes(), (std::vector<int64_t>{1, 300, 48}));
    EXPECT_EQ(neg.mask.sum().item<int64_t>(), 1);
    EXPECT_EQ(neg.mask[0][0].item<int64_t>(), 1);
    torch::NoGradGuard no_grad;
    auto ids = torch::zeros({1, 300}, torch::kLong);
    ids[0][0] = 2;
    EXPECT_TRUE(torch::equal(neg.embeds, model_->forward(ids, neg.mask)));

    // No instruction: the prompt padded to max_sequence_length and every position kept.
    sf::model::SanaPromptOptions plain;
    plain.complex_human_instruction.clear();
    const auto t = sf::model::SanaPromptEncoder(tok, model_, plain).tokenize({"a dog"});
    EXPECT_EQ(t.tokens.length, 300);
    EXPECT_EQ(t.select_index, sf::model::sana_select_index(300, 300));
}

TEST_F(SanaPromptEncoderTest, RefusesATokenizerLargerThanTheModel) {
    auto config = sf::model::Gemma2Config::named("gemma-2-tiny");
    config.vocab_size = 100;
    const std::string msg = error_of(
        [&] { sf::model::SanaPromptEncoder(toy_tokenizer(), sf::model::Gemma2Model(config)); });
    EXPECT_NE(msg.find("toy.model"), std::string::npos) << msg;
}

}  // namespace
