// LoRA on the Sana transformer: a fresh adapter changes nothing, training moves only the adapters,
// the saved file has diffusers' keys and metadata and loads back exactly, bad files and bad targets
// are refused by name, and a bf16 base with fp32 adapters trains under autocast.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/common/autocast.h"
#include "model/common/lora.h"
#include "model/sana/sana_config.h"
#include "model/sana/sana_transformer.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"
#include "test_util.h"

namespace {

using sf::model::add_lora;
using sf::model::LoRAConfig;
using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;

struct Inputs {
    at::Tensor x, caption, timestep, mask;
};

Inputs make_inputs() {
    torch::manual_seed(100);
    return {torch::randn({2, 32, 8, 8}), torch::randn({2, 5, 2304}),
            torch::tensor({250.0f, 900.0f}),
            torch::tensor({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}).view({2, 5})};
}

// Same seed, same base weights.
SanaTransformer make_model(uint64_t seed = 1) {
    torch::manual_seed(seed);
    return SanaTransformer(SanaTransformerConfig::named("sana-tiny"));
}

at::Tensor run(SanaTransformer& model, const Inputs& in) {
    return model(in.x, in.caption, in.timestep, in.mask);
}

bool is_adapter(const std::string& name) {
    return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// Gives every lora_B random values, as training would, so that the adapters change the output.
void randomize_lora_b(torch::nn::Module& model, double stddev = 0.1) {
    torch::NoGradGuard no_grad;
    for (auto& p : model.named_parameters()) {
        if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0, stddev);
    }
}

// The message of the kInvalidArgument error `f` throws.
std::string refusal_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no sf::Error thrown";
    return "";
}

TEST(LoRA, FreshAdaptersLeaveTheOutputUnchanged) {
    const Inputs in = make_inputs();
    SanaTransformer model = make_model();
    torch::NoGradGuard no_grad;
    const at::Tensor before = run(model, in);
    const int64_t adapted = add_lora(*model, LoRAConfig{});
    // peft's suffix match: "to_q" adapts attn1.to_q and attn2.to_q, so 2 attentions x 3 per block.
    EXPECT_EQ(adapted, 2 * 3 * model->config().num_layers);
    EXPECT_TRUE(torch::equal(run(model, in), before));

    auto* block = model->transformer_blocks[0]->as<sf::model::SanaTransformerBlock>();
    EXPECT_TRUE(sf::model::has_lora(block->attn1->to_q));
    EXPECT_TRUE(sf::model::has_lora(block->attn2->to_v));
    EXPECT_FALSE(sf::model::has_lora(block->attn1->out_proj));
    EXPECT_FALSE(sf::model::has_lora(model->proj_out));
    // peft's init: B zero, A kaiming_uniform(a = sqrt(5)), i.e. uniform in +-1 / sqrt(in).
    const at::Tensor a =
        block->attn1->to_q->named_children()["lora_A"]->named_parameters()["weight"];
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
    EXPECT_LE(a.abs().max().item<double>(), bound);
    EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);

    const auto trainable = sf::model::trainable_parameters(*model);
    EXPECT_EQ(static_cast<int64_t>(trainable.size()), 2 * adapted);
    for (const auto& p : model->named_parameters()) {
        EXPECT_EQ(p.value().requires_grad(), is_adapter(p.key())) << p.key();
    }
}

TEST(LoRA, ApplyLinearAddsTheUpdateScaledByAlphaOverRank) {
    torch::manual_seed(3);
    torch::nn::Module root;
    torch::nn::Linear layer(8, 5);
    root.register_module("to_q", layer);
    ASSERT_EQ(add_lora(root, LoRAConfig{2, 6.0, {"to_q"}, 0.5}), 1);
    randomize_lora_b(root);
    auto children = layer->named_children();
    auto a = children["lora_A"]->as<torch::nn::Linear>();
    auto b = children["lora_B"]->as<torch::nn::Linear>();
    EXPECT_EQ(a->weight.sizes(), (at::IntArrayRef{2, 8}));
    EXPECT_EQ(b->weight.sizes(), (at::IntArrayRef{5, 2}));
    const at::Tensor x = torch::randn({64, 8});
    const at::Tensor expected = layer(x) + 3.0 * b->forward(a->forward(x));  // alpha 6 / rank 2

    root.eval();  // no dropout
    EXPECT_TRUE(torch::allclose(sf::model::apply_linear(layer, x), expected, 1e-6, 1e-6));
    root.train();  // dropout on the adapter's input only: two calls differ
    const at::Tensor first = sf::model::apply_linear(layer, x);
    EXPECT_FALSE(torch::equal(first, sf::model::apply_linear(layer, x)));
    EXPECT_FALSE(torch::allclose(first, expected, 1e-4, 1e-4));
}

TEST(LoRA, TrainingMovesOnlyTheAdapters) {
    const Inputs in = make_inputs();
    SanaTransformer model = make_model();
    const at::Tensor before = run(model, in).detach();
    std::map<std::string, at::Tensor> base;
    for (const auto& p : model->named_parameters()) base[p.key()] = p.value().detach().clone();

    add_lora(*model, LoRAConfig{});
    std::map<std::string, at::Tensor> adapters;
    for (const auto& p : model->named_parameters()) {
        if (is_adapter(p.key())) adapters[p.key()] = p.value().detach().clone();
    }
    std::vector<at::Tensor> trainable;
    for (const auto& [name, p] : sf::model::trainable_parameters(*model)) trainable.push_back(p);
    torch::optim::AdamW adamw(trainable, torch::optim::AdamWOptions(1e-2));
    const at::Tensor target = torch::randn_like(before);
    for (int step = 0; step < 3; ++step) {
        adamw.zero_grad();
        torch::mse_loss(run(model, in), target).backward();
        adamw.step();
    }
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(torch::allclose(run(model, in), before, 1e-4, 1e-4));
    size_t checked = 0;
    for (const auto& p : model->named_parameters()) {
        if (is_adapter(p.key())) continue;
        EXPECT_TRUE(torch::equal(p.value(), base.at(p.key()))) << p.key() << " moved";
        EXPECT_FALSE(p.value().grad().defined()) << p.key() << " has a gradient";
        ++checked;
    }
    EXPECT_EQ(checked, base.size());
    for (const auto& [name, value] : adapters) {
        if (name.find(".lora_B.") == std::string::npos) continue;
        EXPECT_FALSE(torch::equal(model->named_parameters()[name], value))
            << name << " did not move";
    }
}

TEST(LoRA, StateDictHasDiffusersKeysAndShapes) {
    SanaTransformer model = make_model();
    const LoRAConfig config{3, 6.0, {"to_q", "to_k", "to_v"}, 0.0};
    const int64_t adapted = add_lora(*model, config);
    const auto sd = sf::model::lora_state_dict(*model);
    ASSERT_EQ(static_cast<int64_t>(sd.size()), 2 * adapted);
    const auto params = model->named_parameters();
    std::map<std::string, at::Tensor> by_name(sd.begin(), sd.end());
    EXPECT_TRUE(by_name.count("transformer.transformer_blocks.0.attn1.to_q.lora_A.weight"));
    EXPECT_TRUE(by_name.count("transformer.transformer_blocks.1.attn2.to_v.lora_B.weight"));
    for (const auto& [name, tensor] : sd) {
        ASSERT_EQ(name.rfind("transformer.transformer_blocks.", 0), 0u) << name;
        const std::string key = name.substr(std::string("transformer.").size());
        // The name is the live model's own state-dict key, and the tensor is that parameter.
        ASSERT_TRUE(params.contains(key)) << key;
        EXPECT_TRUE(params[key].is_same(tensor)) << key;
        const bool is_a = key.size() > 14 && key.substr(key.size() - 14) == ".lora_A.weight";
        const bool is_b = key.size() > 14 && key.substr(key.size() - 14) == ".lora_B.weight";
        ASSERT_TRUE(is_a || is_b) << key;
        const at::Tensor& base = params[key.substr(0, key.size() - 14) + ".weight"];  // [out, in]
        const auto want = is_a ? std::vector<int64_t>{config.rank, base.size(1)}
                               : std::vector<int64_t>{base.size(0), config.rank};
        EXPECT_EQ(tensor.sizes(), at::IntArrayRef(want)) << key;
    }
    // The prefix is the caller's: "" gives peft's keys of the model itself.
    EXPECT_EQ(sf::model::lora_state_dict(*model, "").front().first,
              "transformer_blocks.0.attn1.to_q.lora_A.weight");
}

TEST(LoRA, SaveThenLoadReproducesTheOutputExactly) {
    sf::test::TempDir dir("sf_lora");
    const Inputs in = make_inputs();
    const LoRAConfig config{4, 8.0, {"to_q", "to_k", "to_v", "to_out.0"}, 0.0};
    SanaTransformer trained = make_model();
    const int64_t adapted = add_lora(*trained, config);
    randomize_lora_b(*trained);
    const std::string file = dir.file(sf::model::kLoraWeightName);
    sf::model::save_lora(*trained, file, {{"sanaflow.step", "3"}});

    // Nothing but adapter tensors, and the metadata diffusers reads its LoraConfig from.
    auto st = sf::storage::SafetensorsFile::open(file, sf::storage::ChecksumPolicy::kRequire);
    EXPECT_EQ(static_cast<int64_t>(st.names().size()), 2 * adapted);
    for (const auto& name : st.names()) {
        EXPECT_TRUE(is_adapter(name) && name.rfind("transformer.", 0) == 0) << name;
        EXPECT_EQ(st.info(name).dtype, sf::storage::DType::kF32) << name;
    }
    EXPECT_EQ(st.metadata().at("format"), "pt");
    EXPECT_EQ(st.metadata().at("sanaflow.step"), "3");
    const auto meta = nlohmann::json::parse(st.metadata().at("lora_adapter_metadata"));
    EXPECT_EQ(meta.at("transformer.r").get<int64_t>(), 4);
    EXPECT_EQ(meta.at("transformer.lora_alpha").get<double>(), 8.0);
    EXPECT_EQ(meta.at("transformer.target_modules").get<std::vector<std::string>>(),
              config.targets);
    EXPECT_TRUE(meta.at("transformer.rank_pattern").empty());

    SanaTransformer loaded = make_model();
    add_lora(*loaded, config);  // fresh adapters: different A, zero B
    torch::NoGradGuard no_grad;
    const at::Tensor expected = run(trained, in);
    EXPECT_FALSE(torch::equal(run(loaded, in), expected));
    sf::model::load_lora(*loaded, dir.path().string());  // diffusers' output_dir works too
    EXPECT_TRUE(torch::equal(run(loaded, in), expected));

    // A model's own file (diffusers' save_lora_adapter) has no "transformer." prefix.
    std::map<std::string, sf::storage::TensorView> views;
    std::vector<at::Tensor> keep;
    for (const auto& [name, t] : sf::model::lora_state_dict(*trained, "")) {
        keep.push_back(t.contiguous());
        views[name] = sf::storage::view_of(keep.back());
    }
    sf::storage::write_safetensors_file(dir.file("plain.safetensors"), views, {});
    SanaTransformer plain = make_model();
    add_lora(*plain, config);
    sf::model::load_lora(*plain, dir.file("plain.safetensors"));
    EXPECT_TRUE(torch::equal(run(plain, in), expected));
}

// diffusers v0.33.1 ignores lora_adapter_metadata and applies a LoRA as W + B A. The file training
// writes has alpha / rank baked into lora_B, so that reading of it is the trained forward; it
// loads back into adapters with alpha = rank.
struct OneLinear : torch::nn::Module {
    torch::nn::Linear to_q{nullptr};
    OneLinear() { to_q = register_module("to_q", torch::nn::Linear(8, 6)); }
};

TEST(LoRA, ABakedFileAppliedAsWPlusBAIsTheTrainedForward) {
    sf::test::TempDir dir("sf_lora_baked");
    torch::manual_seed(3);
    auto trained = std::make_shared<OneLinear>();
    add_lora(*trained, LoRAConfig{4, 8.0, {"to_q"}, 0.0});
    randomize_lora_b(*trained);
    const std::string file = dir.file(sf::model::kLoraWeightName);
    sf::model::save_lora(*trained, file, {}, /*bake_scale=*/true);

    auto st = sf::storage::SafetensorsFile::open(file, sf::storage::ChecksumPolicy::kRequire);
    EXPECT_EQ(st.metadata().at("format"), "pt");
    const auto meta = nlohmann::json::parse(st.metadata().at("lora_adapter_metadata"));
    EXPECT_EQ(meta.at("transformer.lora_alpha").get<double>(), 4.0);  // = rank
    EXPECT_EQ(st.metadata().at("sanaflow.trained_lora_alpha"), "8");
    auto tensor = [&](const std::string& name) {
        return sf::storage::from_tensor_data(st.read(name));
    };
    const at::Tensor a = tensor("transformer.to_q.lora_A.weight");
    const at::Tensor b = tensor("transformer.to_q.lora_B.weight");
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({5, 8});
    const at::Tensor expected = sf::model::apply_linear(trained->to_q, x);
    const at::Tensor merged =
        torch::nn::functional::linear(x, trained->to_q->weight + b.matmul(a), trained->to_q->bias);
    EXPECT_TRUE(torch::allclose(merged, expected, 1e-5, 1e-6))
        << (merged - expected).abs().max().item<float>();
    // The unbaked file would be off by alpha / rank under that reading.
    EXPECT_FALSE(
        torch::allclose(torch::nn::functional::linear(x, trained->to_q->weight + (b / 2).matmul(a),
                                                      trained->to_q->bias),
                        expected, 1e-5, 1e-6));

    auto loaded = std::make_shared<OneLinear>();
    loaded->to_q->weight.copy_(trained->to_q->weight);
    loaded->to_q->bias.copy_(trained->to_q->bias);
    add_lora(*loaded, LoRAConfig{4, 4.0, {"to_q"}, 0.0});
    sf::model::load_lora(*loaded, file);
    EXPECT_TRUE(torch::allclose(sf::model::apply_linear(loaded->to_q, x), expected, 1e-5, 1e-6));
    // Into adapters of the trained alpha: B divided again, the same forward.
    auto again = std::make_shared<OneLinear>();
    again->to_q->weight.copy_(trained->to_q->weight);
    again->to_q->bias.copy_(trained->to_q->bias);
    add_lora(*again, LoRAConfig{4, 8.0, {"to_q"}, 0.0});
    sf::model::load_lora(*again, file);
    EXPECT_TRUE(torch::allclose(sf::model::apply_linear(again->to_q, x), expected, 1e-5, 1e-6));
    // Any other alpha is refused, naming the file's.
    auto other = std::make_shared<OneLinear>();
    add_lora(*other, LoRAConfig{4, 2.0, {"to_q"}, 0.0});
    EXPECT_THROW(sf::model::load_lora(*other, file), sf::Error);
}

TEST(LoRA, LoadRefusesMissingMisshapedAndUnexpectedTensorsNamingThem) {
    sf::test::TempDir dir("sf_lora");
    SanaTransformer model = make_model();
    add_lora(*model, LoRAConfig{});
    const std::string missing = "transformer.transformer_blocks.1.attn1.to_k.lora_B.weight";
    const std::string misshaped = "transformer.transformer_blocks.0.attn2.to_q.lora_A.weight";
    const std::string unexpected = "transformer.proj_out.lora_A.weight";
    std::map<std::string, sf::storage::TensorView> views;
    std::vector<at::Tensor> keep;
    for (const auto& [name, t] : sf::model::lora_state_dict(*model)) {
        if (name == missing) continue;
        keep.push_back(name == misshaped ? torch::zeros({5, t.size(1)}) : t.detach().clone());
        views[name] = sf::storage::view_of(keep.back());
    }
    keep.push_back(torch::zeros({4, 64}));
    views[unexpected] = sf::storage::view_of(keep.back());
    sf::storage::write_safetensors_file(dir.file("bad.safetensors"), views, {});

    SanaTransformer target = make_model(2);
    add_lora(*target, LoRAConfig{});
    const auto before = sf::model::lora_state_dict(*target);
    std::vector<at::Tensor> copies;
    for (const auto& [name, t] : before) copies.push_back(t.detach().clone());
    const std::string msg =
        refusal_of([&] { sf::model::load_lora(*target, dir.file("bad.safetensors")); });
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_NE(msg.find(misshaped + ": file has [5, 64], model wants [4, 64]"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(unexpected), std::string::npos) << msg;
    // Refused means untouched: nothing was copied.
    for (size_t i = 0; i < before.size(); ++i) {
        EXPECT_TRUE(torch::equal(before[i].second, copies[i])) << before[i].first;
    }

    // Same shapes, other scale: diffusers would scale by the file's alpha, so it is refused too.
    SanaTransformer other = make_model();
    add_lora(*other, LoRAConfig{4, 16.0, {"to_q", "to_k", "to_v"}, 0.0});
    sf::model::save_lora(*other, dir.file("alpha16.safetensors"));
    const std::string alpha_msg =
        refusal_of([&] { sf::model::load_lora(*target, dir.file("alpha16.safetensors")); });
    EXPECT_NE(alpha_msg.find("transformer.lora_alpha: file has 16, model has 4"), std::string::npos)
        << alpha_msg;

    SanaTransformer bare = make_model();
    EXPECT_NE(refusal_of([&] {
                  sf::model::load_lora(*bare, dir.file("alpha16.safetensors"));
              }).find("no LoRA adapters"),
              std::string::npos);
    EXPECT_NE(refusal_of([&] {
                  sf::model::save_lora(*bare, dir.file("none.safetensors"));
              }).find("no LoRA adapters"),
              std::string::npos);
}

TEST(LoRA, EachAttentionProjectionIsRoutedThroughItsAdapter) {
    const Inputs in = make_inputs();
    torch::NoGradGuard no_grad;
    SanaTransformer base_model = make_model();
    const at::Tensor base = run(base_model, in);
    for (const char* target : {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                               "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"}) {
        SanaTransformer model = make_model();
        EXPECT_EQ(add_lora(*model, LoRAConfig{4, 4.0, {target}, 0.0}), model->config().num_layers)
            << target;
        randomize_lora_b(*model);
        EXPECT_FALSE(torch::allclose(run(model, in), base, 1e-5, 1e-5)) << target << " unused";
    }
    SanaTransformer model = make_model();
    EXPECT_EQ(add_lora(*model, LoRAConfig{4, 4.0, {"to_out.0"}, 0.0}),
              2 * model->config().num_layers);
    EXPECT_EQ(sf::model::lora_state_dict(*model)[0].first,
              "transformer.transformer_blocks.0.attn1.to_out.0.lora_A.weight");
}

TEST(LoRA, BadConfigsAndTargetsAreRefusedNamingThem) {
    SanaTransformer model = make_model();
    std::string msg = refusal_of([&] { add_lora(*model, LoRAConfig{4, 4.0, {"to_qq"}, 0.0}); });
    EXPECT_NE(msg.find("\"to_qq\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("to_out.0"), std::string::npos) << msg;  // the Linear names on offer
    EXPECT_NE(msg.find("proj_out"), std::string::npos) << msg;
    msg = refusal_of([&] { add_lora(*model, LoRAConfig{4, 4.0, {"to_q", "conv_depth"}, 0.0}); });
    EXPECT_NE(msg.find("\"conv_depth\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("Conv2d"), std::string::npos) << msg;
    EXPECT_NE(refusal_of([&] {
                  add_lora(*model, LoRAConfig{0, 4.0, {"to_q"}, 0.0});
              }).find("rank"),
              std::string::npos);
    EXPECT_NE(refusal_of([&] {
                  add_lora(*model, LoRAConfig{4, 0.0, {"to_q"}, 0.0});
              }).find("alpha"),
              std::string::npos);
    EXPECT_NE(refusal_of([&] {
                  add_lora(*model, LoRAConfig{4, 4.0, {}, 0.0});
              }).find("targets"),
              std::string::npos);
    EXPECT_NE(refusal_of([&] {
                  add_lora(*model, LoRAConfig{4, 4.0, {"to_q"}, 1.0});
              }).find("dropout"),
              std::string::npos);
    // Refused means untouched: nothing frozen, nothing added.
    for (const auto& p : model->named_parameters()) {
        EXPECT_TRUE(p.value().requires_grad()) << p.key();
        EXPECT_FALSE(is_adapter(p.key())) << p.key();
    }
    add_lora(*model, LoRAConfig{});
    EXPECT_NE(refusal_of([&] { add_lora(*model, LoRAConfig{}); }).find("already"),
              std::string::npos);
}

TEST(LoRA, CastFrozenKeepsFp32AdaptersThatTrainUnderBf16Autocast) {
    const Inputs in = make_inputs();
    SanaTransformer model = make_model();
    add_lora(*model, LoRAConfig{4, 4.0, {"to_q", "to_k", "to_v", "to_out.0"}, 0.0});
    randomize_lora_b(*model);  // so that lora_A gets a gradient too
    sf::model::cast_frozen(*model, at::kBFloat16);
    for (const auto& p : model->named_parameters()) {
        EXPECT_EQ(p.value().scalar_type(), is_adapter(p.key()) ? at::kFloat : at::kBFloat16)
            << p.key();
    }
    at::Tensor out;
    {
        sf::model::AutocastGuard autocast(c10::DeviceType::CPU, at::kBFloat16);
        out = run(model, in);
    }
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    torch::mse_loss(out.to(at::kFloat), torch::zeros({2, 32, 8, 8})).backward();
    for (const auto& p : model->named_parameters()) {
        const at::Tensor& grad = p.value().grad();
        if (!is_adapter(p.key())) {
            EXPECT_FALSE(grad.defined()) << p.key();
            continue;
        }
        ASSERT_TRUE(grad.defined()) << p.key();
        EXPECT_EQ(grad.scalar_type(), at::kFloat) << p.key();
        EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << p.key();
        EXPECT_GT(grad.abs().max().item<double>(), 0.0) << p.key();
    }
}

}  // namespace
