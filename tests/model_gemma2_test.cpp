// Gemma-2 text encoder: the upstream golden forward (transformers v4.47.0 Gemma2Model, eager),
// the sliding window and padding masks, weights by name, config parsing, parameter counts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/common/weights.h"
#include "model/gemma/gemma2.h"
#include "model_golden_util.h"
#include "test_util.h"

namespace {

using sf::test::error_of;

using sf::model::Gemma2Config;
using sf::model::Gemma2Model;

// The golden tiny model, loaded; skips the test when the data is absent.
Gemma2Model golden_model() {
    const std::string dir = sf::test::golden_path("text_encoder");
    Gemma2Model model(Gemma2Config::from_json_file(dir));
    sf::model::load_gemma2_weights(model, dir);
    model->eval();
    return model;
}

TEST(Gemma2Config, ReadsTheGoldenConfigJson) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    const auto c = Gemma2Config::from_json_file(sf::test::golden_path("text_encoder"));
    EXPECT_EQ(c.vocab_size, 128);
    EXPECT_EQ(c.hidden_size, 48);
    EXPECT_EQ(c.intermediate_size, 96);
    EXPECT_EQ(c.num_hidden_layers, 2);
    EXPECT_EQ(c.num_attention_heads, 4);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.sliding_window, 4);
    EXPECT_EQ(c.attn_logit_softcapping, 4.0);
    EXPECT_EQ(c.query_pre_attn_scalar, 24.0);
    EXPECT_EQ(c.pad_token_id, 0);
    EXPECT_TRUE(c.is_sliding(0));
    EXPECT_FALSE(c.is_sliding(1));
}

TEST(Gemma2Config, NamesTheKeyAndFileOfAWrongType) {
    nlohmann::json j = {{"hidden_size", "48"}, {"some_future_key", {1, 2}}};
    std::string msg = error_of([&] { Gemma2Config::from_json(j, "te/config.json"); });
    EXPECT_NE(msg.find("te/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"hidden_size\" must be an integer"), std::string::npos) << msg;

    j = {{"sliding_window", 4.5}};
    msg = error_of([&] { Gemma2Config::from_json(j, "x.json"); });
    EXPECT_NE(msg.find("\"sliding_window\" must be an integer or null"), std::string::npos) << msg;

    j = {{"num_attention_heads", 6}, {"num_key_value_heads", 4}};
    msg = error_of([&] { Gemma2Config::from_json(j, "x.json"); });
    EXPECT_NE(msg.find("num_key_value_heads"), std::string::npos) << msg;

    j = {{"hidden_activation", "silu"}};
    msg = error_of([&] { Gemma2Config::from_json(j, "x.json"); });
    EXPECT_NE(msg.find("hidden_activation"), std::string::npos) << msg;

    j = {{"model_type", "llama"}};
    msg = error_of([&] { Gemma2Config::from_json(j, "x.json"); });
    EXPECT_NE(msg.find("model_type"), std::string::npos) << msg;

    msg = error_of([] { Gemma2Config::from_json_file("/nonexistent/text_encoder"); });
    EXPECT_NE(msg.find("/nonexistent/text_encoder"), std::string::npos) << msg;
}

TEST(Gemma2Config, NullsLayerTypesAndNestedRope) {
    nlohmann::json j = {{"attn_logit_softcapping", nullptr},
                        {"sliding_window", nullptr},
                        {"unknown", "ignored"},
                        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}};
    auto c = Gemma2Config::from_json(j);
    EXPECT_FALSE(c.attn_logit_softcapping.has_value());
    EXPECT_FALSE(c.is_sliding(0));  // no window, no sliding layer
    EXPECT_EQ(c.rope_theta, 5000.0);

    j = {{"num_hidden_layers", 3},
         {"layer_types", {"full_attention", "sliding_attention", "sliding_attention"}}};
    c = Gemma2Config::from_json(j);
    EXPECT_FALSE(c.is_sliding(0));
    EXPECT_TRUE(c.is_sliding(1));
    EXPECT_TRUE(c.is_sliding(2));
    j["layer_types"] = {"full_attention"};
    EXPECT_NE(
        error_of([&] { Gemma2Config::from_json(j); }).find("\"layer_types\" has 1 entries for 3"),
        std::string::npos);
}

TEST(Gemma2Config, NamedConfigs) {
    const auto big = Gemma2Config::named("gemma-2-2b");
    EXPECT_EQ(big.hidden_size, 2304);
    EXPECT_EQ(big.num_hidden_layers, 26);
    EXPECT_EQ(big.num_attention_heads, 8);
    EXPECT_EQ(big.num_key_value_heads, 4);
    EXPECT_EQ(big.head_dim, 256);
    EXPECT_EQ(big.intermediate_size, 9216);
    EXPECT_EQ(big.vocab_size, 256000);
    EXPECT_EQ(big.sliding_window, 4096);
    EXPECT_EQ(big.attn_logit_softcapping, 50.0);
    EXPECT_EQ(big.query_pre_attn_scalar, 256.0);
    EXPECT_NO_THROW(Gemma2Config::named("gemma-2-tiny").validate());
    EXPECT_NE(error_of([] { Gemma2Config::named("gemma-3"); }).find("gemma-2-tiny"),
              std::string::npos);
}

TEST(Gemma2Model, ParameterCountIsAnalytic) {
    for (const std::string name : {"gemma-2-tiny"}) {
        const auto c = Gemma2Config::named(name);
        Gemma2Model m(c);
        EXPECT_EQ(sf::model::gemma2_parameter_count(c), sf::model::parameter_count(*m)) << name;
    }
    auto biased = Gemma2Config::named("gemma-2-tiny");
    biased.attention_bias = true;
    EXPECT_EQ(sf::model::gemma2_parameter_count(biased),
              sf::model::parameter_count(*Gemma2Model(biased)));
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    const auto golden = Gemma2Config::from_json_file(sf::test::golden_path("text_encoder"));
    EXPECT_EQ(sf::model::gemma2_parameter_count(golden),
              sf::model::parameter_count(*Gemma2Model(golden)));
    // Gemma2Model of google/gemma-2-2b without the (tied) LM head: 589,824,000 embedding +
    // 26 x 77,865,984 per layer + 2,304 final norm.
    const int64_t big = sf::model::gemma2_parameter_count(Gemma2Config::named("gemma-2-2b"));
    std::printf("[ params   ] gemma-2-2b Gemma2Model: %lld\n", static_cast<long long>(big));
    EXPECT_EQ(big, 2614341888LL);
}

TEST(Gemma2Model, StateDictKeysAreTransformers) {
    Gemma2Model m(Gemma2Config::named("gemma-2-tiny"));
    std::set<std::string> keys;
    for (const auto& [name, t] : sf::model::state_dict(*m)) keys.insert(name);
    for (const char* k :
         {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
          "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
          "layers.0.self_attn.o_proj.weight", "layers.1.mlp.gate_proj.weight",
          "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight",
          "layers.1.input_layernorm.weight", "layers.1.post_attention_layernorm.weight",
          "layers.1.pre_feedforward_layernorm.weight", "layers.1.post_feedforward_layernorm.weight",
          "norm.weight"}) {
        EXPECT_TRUE(keys.count(k)) << k;
    }
    EXPECT_EQ(keys.size(), 1u + 2u * 11u + 1u);  // no inv_freq buffer: upstream's is not saved
}

TEST(Gemma2Golden, ForwardMatchesTransformers) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto model = golden_model();
    auto ref = sf::test::load_ref("text_encoder_forward.safetensors");
    torch::NoGradGuard no_grad;
    const auto out = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    // Row 1 is right-padded: the padded positions are compared too.
    ASSERT_EQ(ref.at("attention_mask")[1].sum().item<int64_t>(), 9);
    const auto stats = sf::test::expect_close(out, ref.at("last_hidden_state"), 1e-4, 1e-5,
                                              "text_encoder last_hidden_state");
    EXPECT_TRUE(stats.ok);
}

// Sequential offload computes what the resident model computes (here the "device" is the host, so
// this checks the offload path's plumbing: host embedding, per-layer weight swaps, restored
// weights); a model not in host memory is refused.
TEST(Gemma2Golden, OffloadedForwardEqualsResidentAndRestoresTheWeights) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto model = golden_model();
    auto ref = sf::test::load_ref("text_encoder_forward.safetensors");
    torch::NoGradGuard no_grad;
    const auto resident = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    std::vector<void*> before;
    for (const auto& p : model->parameters()) before.push_back(p.data_ptr());
    model->set_offload(c10::Device(c10::kCPU));
    const auto offloaded = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    EXPECT_TRUE(torch::equal(resident, offloaded));
    std::vector<void*> after;
    for (const auto& p : model->parameters()) after.push_back(p.data_ptr());
    EXPECT_EQ(before, after);  // the host weights themselves, not copies
    model->set_offload(std::nullopt);
    EXPECT_TRUE(
        torch::equal(model->forward(ref.at("input_ids"), ref.at("attention_mask")), resident));
}

TEST(Gemma2Golden, SlidingWindowMattersBeyondTheWindowOnly) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto ref = sf::test::load_ref("text_encoder_forward.safetensors");
    auto config = Gemma2Config::from_json_file(sf::test::golden_path("text_encoder"));
    config.sliding_window = std::nullopt;  // every layer attends to the whole prefix
    Gemma2Model full(config);
    sf::model::load_gemma2_weights(full, sf::test::golden_path("text_encoder"));
    torch::NoGradGuard no_grad;
    const auto out = full->forward(ref.at("input_ids"), ref.at("attention_mask"));
    const auto& expected = ref.at("last_hidden_state");
    // Queries 0..3 see at most 4 keys either way; later ones lose keys to the window.
    EXPECT_TRUE(torch::allclose(out.slice(1, 0, 4), expected.slice(1, 0, 4), 1e-4, 1e-5));
    const double later = (out.slice(1, 4) - expected.slice(1, 4)).abs().max().item<double>();
    EXPECT_GT(later, 1e-2);
}

TEST(Gemma2Golden, RealTokensIgnoreWhatIsInThePadding) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto model = golden_model();
    auto ref = sf::test::load_ref("text_encoder_forward.safetensors");
    torch::NoGradGuard no_grad;
    auto ids = ref.at("input_ids").clone();
    const auto mask = ref.at("attention_mask");
    const auto a = model->forward(ids, mask);
    ids.index_put_({1, torch::indexing::Slice(9)}, 77);  // other ids in row 1's padding
    const auto b = model->forward(ids, mask);
    EXPECT_TRUE(torch::equal(a[1].slice(0, 0, 9), b[1].slice(0, 0, 9)));
    EXPECT_TRUE(torch::equal(a[0], b[0]));
    // A row alone computes what it computes in the batch.
    const auto alone = model->forward(ids.slice(0, 1, 2), mask.slice(0, 1, 2));
    EXPECT_TRUE(torch::allclose(alone[0], b[1], 1e-5, 1e-6));
    // Without a mask nothing is padding: the padded row's real tokens see the same prefix, but its
    // padded positions now attend to themselves.
    const auto unmasked = model->forward(ids);
    EXPECT_TRUE(torch::allclose(unmasked[1].slice(0, 0, 9), b[1].slice(0, 0, 9), 1e-5, 1e-6));
    EXPECT_FALSE(torch::allclose(unmasked[1].slice(0, 9), b[1].slice(0, 9), 1e-3, 1e-3));
}

TEST(Gemma2Golden, DeterministicAndBf16Close) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto model = golden_model();
    auto ref = sf::test::load_ref("text_encoder_forward.safetensors");
    torch::NoGradGuard no_grad;
    const auto a = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    const auto b = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    EXPECT_TRUE(torch::equal(a, b));
    model->to(torch::kBFloat16);
    const auto half = model->forward(ref.at("input_ids"), ref.at("attention_mask"));
    EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
    const double err = (half.to(torch::kFloat) - a).abs().max().item<double>();
    EXPECT_LT(err, 0.1 * a.abs().max().item<double>());
}

TEST(Gemma2Mask, CausalPaddingAndWindowWithTheLowestFiniteValue) {
    const auto padding = torch::tensor({1, 1, 1, 1, 0}, torch::kLong).view({1, 5});
    const auto m = sf::model::gemma2_attention_mask(padding, 1, 5, 2, torch::kFloat, torch::kCPU);
    ASSERT_EQ(m.sizes(), (std::vector<int64_t>{1, 1, 5, 5}));
    const float lo = std::numeric_limits<float>::lowest();
    // Query i attends keys j with i - 2 < j <= i that are not padding.
    const float expected[5][5] = {{0, lo, lo, lo, lo},
                                  {0, 0, lo, lo, lo},
                                  {lo, 0, 0, lo, lo},
                                  {lo, lo, 0, 0, lo},
                                  {lo, lo, lo, 0, lo}};
    for (int i = 0; i < 5; ++i) {
        for (int j = 0; j < 5; ++j)
            EXPECT_EQ(m[0][0][i][j].item<float>(), expected[i][j]) << i << "," << j;
    }
    const auto bf =
        sf::model::gemma2_attention_mask({}, 2, 3, std::nullopt, torch::kBFloat16, torch::kCPU);
    EXPECT_EQ(bf.sizes(), (std::vector<int64_t>{2, 1, 3, 3}));
    EXPECT_EQ(bf[1][0][0][2].item<float>(),
              static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest()));
}

TEST(Gemma2Model, RefusesBadInputs) {
    Gemma2Model m(Gemma2Config::named("gemma-2-tiny"));
    torch::NoGradGuard no_grad;
    EXPECT_NE(error_of([&] {
                  m->forward(torch::full({1, 3}, 384, torch::kLong));
              }).find("outside the vocabulary"),
              std::string::npos);
    EXPECT_NE(error_of([&] { m->forward(torch::zeros({3}, torch::kLong)); }).find("input_ids"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  m->forward(torch::zeros({1, 3}, torch::kLong), torch::ones({1, 4}));
              }).find("attention_mask"),
              std::string::npos);
}

TEST(Gemma2Weights, RefusesMissingAndMisshapedTensorsNamingAll) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto config = Gemma2Config::from_json_file(sf::test::golden_path("text_encoder"));
    config.num_hidden_layers = 3;
    config.intermediate_size = 80;
    Gemma2Model wrong(config);
    const std::string msg = error_of(
        [&] { sf::model::load_gemma2_weights(wrong, sf::test::golden_path("text_encoder")); });
    EXPECT_NE(msg.find("golden/text_encoder"), std::string::npos) << msg;
    EXPECT_NE(msg.find("11 missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.2.self_attn.q_proj.weight [64, 48]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6 misshaped"), std::string::npos) << msg;
    EXPECT_NE(
        msg.find("layers.0.mlp.gate_proj.weight: checkpoint has [96, 48], model wants [80, 48]"),
        std::string::npos)
        << msg;
}

TEST(Gemma2Weights, LoadsACausalLMCheckpoint) {
    SF_REQUIRE_GOLDEN("text_encoder/config.json");
    auto model = golden_model();
    // Gemma2ForCausalLM's layout: the decoder under "model.", plus the tied head.
    auto holder = std::make_shared<torch::nn::Module>();
    holder->register_module("model", model.ptr());
    auto head = holder->register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(48, 128).bias(false)));
    head->weight.set_data(model->embed_tokens->weight.detach().clone());
    sf::test::TempDir tmp("sf_gemma2");
    sf::model::save_weights(*holder, tmp.file("model.safetensors"));
    Gemma2Model loaded(model->config());
    const auto report = sf::model::load_gemma2_weights(loaded, tmp.file("model.safetensors"));
    EXPECT_EQ(report.tensors, 24);
    for (const auto& [name, t] : sf::model::state_dict(*model)) {
        EXPECT_TRUE(torch::equal(t, loaded->named_parameters()[name])) << name;
    }
}

}  // namespace
