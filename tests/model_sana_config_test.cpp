// SanaTransformerConfig: diffusers' config.json read and written with upstream's keys, errors that
// name the key and the file, the named configurations, and the parameter count from the numbers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "model/common/weights.h"
#include "model/sana/sana_config.h"
#include "model/sana/sana_transformer.h"
#include "model_golden_util.h"
#include "test_util.h"

namespace {

using sf::model::sana_parameter_count;
using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;
using sf::test::golden_path;

// Runs `call`, expects kInvalidArgument with every one of `parts` in the message.
template <typename Fn>
void expect_invalid(Fn call, std::initializer_list<const char*> parts) {
    try {
        call();
        ADD_FAILURE() << "accepted; expected an error naming " << *parts.begin();
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument) << e.what();
        for (const char* part : parts) {
            EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
                << "no \"" << part << "\" in: " << e.what();
        }
    }
}

TEST(SanaConfig, ReadsTheGoldenDiffusersConfigs) {
    const auto c = SanaTransformerConfig::from_json_file(golden_path("transformer"));
    EXPECT_EQ(c.in_channels, 8);
    EXPECT_EQ(c.out_channels, 8);
    EXPECT_EQ(c.inner_dim(), 64);
    EXPECT_EQ(c.num_layers, 2);
    EXPECT_EQ(c.cross_inner_dim(), 64);
    EXPECT_EQ(c.caption_channels, 24);
    EXPECT_EQ(c.ff_hidden_dim(), 160);
    EXPECT_EQ(c.patch_size, 1);
    EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
    EXPECT_FALSE(c.interpolation_scale.has_value());
    EXPECT_FALSE(c.qk_norm.has_value());
    // A directory and its config.json are the same thing.
    const auto pe =
        SanaTransformerConfig::from_json_file(golden_path("transformer_pe/config.json"));
    EXPECT_EQ(pe.patch_size, 2);
    ASSERT_TRUE(pe.interpolation_scale.has_value());
    EXPECT_DOUBLE_EQ(*pe.interpolation_scale, 2.0);
}

TEST(SanaConfig, MissingKeysTakeUpstreamDefaultsAndUnknownKeysAreIgnored) {
    const auto c = SanaTransformerConfig::from_json(
        R"({"num_layers": 3, "out_channels": null, "in_channels": 16, "future_key": [1, 2]})");
    EXPECT_EQ(c.num_layers, 3);
    EXPECT_EQ(c.out_channels, 16);  // `out_channels or in_channels`
    EXPECT_EQ(c.num_attention_heads, 70);
    EXPECT_EQ(c.cross_attention_head_dim, 112);
    EXPECT_EQ(c.caption_channels, 2304);
}

TEST(SanaConfig, RefusesWrongTypesAndValuesNamingKeyAndFile) {
    sf::test::TempDir tmp("sf_sana_config");
    const std::string file = tmp.file("config.json");
    sf::test::write_file(file, R"({"num_layers": "2"})");
    expect_invalid([&] { SanaTransformerConfig::from_json_file(file); },
                   {"num_layers", file.c_str()});
    expect_invalid([&] { SanaTransformerConfig::from_json_file(tmp.path().string()); },
                   {"num_layers", file.c_str()});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"mlp_ratio": true})", "x.json"); },
                   {"mlp_ratio", "x.json"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"patch_size": 1.5})"); },
                   {"patch_size"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"qk_norm": 3})"); }, {"qk_norm"});
    expect_invalid([] { SanaTransformerConfig::from_json("{not json", "bad.json"); },
                   {"bad.json", "JSON"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"_class_name": "AutoencoderDC"})"); },
                   {"_class_name", "AutoencoderDC"});
    // Values upstream could not run, or that sanaflow does not implement.
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"cross_attention_dim": 1024})"); },
                   {"cross_attention_dim", "2240"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"guidance_embeds": true})"); },
                   {"guidance_embeds"});
    expect_invalid(
        [] { SanaTransformerConfig::from_json(R"({"qk_norm": "rms_norm_across_heads"})"); },
        {"qk_norm", "rms_norm_across_heads"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"num_layers": 0})", "y.json"); },
                   {"num_layers", "y.json"});
    expect_invalid([] { SanaTransformerConfig::from_json(R"({"cross_attention_dim": null})"); },
                   {"null cross-attention"});
    try {
        SanaTransformerConfig::from_json_file(tmp.file("absent.json"));
        ADD_FAILURE() << "a missing file must be refused";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kNotFound);
    }
}

TEST(SanaConfig, TheModelValidatesItsConfigToo) {
    SanaTransformerConfig c = SanaTransformerConfig::named("sana-tiny");
    // Width 3 x 10 = 30 runs without a position embedding, but the sin-cos one needs a multiple
    // of 4; the constructor refuses it before building anything.
    c.num_attention_heads = 3;
    c.attention_head_dim = 10;
    c.cross_attention_dim = 30;
    EXPECT_NO_THROW(SanaTransformer{c});
    c.interpolation_scale = 1.0;
    expect_invalid([&] { SanaTransformer model(c); }, {"interpolation_scale", "30"});
}

TEST(SanaConfig, ToJsonRoundTrips) {
    SanaTransformerConfig c = SanaTransformerConfig::from_json_file(golden_path("transformer_pe"));
    c.norm_elementwise_affine = true;
    c.attention_bias = true;
    const auto back = SanaTransformerConfig::from_json(c.to_json());
    EXPECT_EQ(back.to_json(), c.to_json());
    EXPECT_TRUE(back.attention_bias);
    EXPECT_EQ(back.interpolation_scale, c.interpolation_scale);
    EXPECT_NE(c.to_json().find("\"_class_name\": \"SanaTransformer2DModel\""), std::string::npos);
}

TEST(SanaConfig, NamedConfigsAreTheUpstreamModels) {
    const auto small = SanaTransformerConfig::named("sana-600m");
    EXPECT_EQ(small.inner_dim(), 1152);
    EXPECT_EQ(small.num_layers, 28);
    EXPECT_EQ(small.cross_inner_dim(), 16 * 72);
    EXPECT_EQ(small.ff_hidden_dim(), 2880);
    const auto large = SanaTransformerConfig::named("sana-1600m");
    EXPECT_EQ(large.inner_dim(), 2240);
    EXPECT_EQ(large.num_layers, 20);
    EXPECT_EQ(large.cross_inner_dim(), 20 * 112);
    EXPECT_EQ(large.ff_hidden_dim(), 5600);
    for (const auto& name : SanaTransformerConfig::names()) {
        EXPECT_NO_THROW(SanaTransformerConfig::named(name)) << name;
    }
    expect_invalid([] { SanaTransformerConfig::named("sana-4800m"); }, {"sana-4800m", "sana-600m"});
}

TEST(SanaConfig, ParameterCountFromTheConfigEqualsTheModule) {
    std::vector<std::pair<std::string, SanaTransformerConfig>> configs = {
        {"golden transformer", SanaTransformerConfig::from_json_file(golden_path("transformer"))},
        {"golden transformer_pe",
         SanaTransformerConfig::from_json_file(golden_path("transformer_pe"))},
        {"sana-tiny", SanaTransformerConfig::named("sana-tiny")},
    };
    // Every optional parameter at once, and a mlp_ratio whose product is truncated.
    SanaTransformerConfig options = SanaTransformerConfig::named("sana-tiny");
    options.attention_bias = true;
    options.norm_elementwise_affine = true;
    options.mlp_ratio = 2.3;  // int(2.3 * 64) = 147
    options.patch_size = 2;
    options.out_channels = 12;
    configs.emplace_back("all options", options);
    // The real width with one block (34M parameters): blocks are identical and the count is
    // linear in them, so this pins the 28-block count without 2.4 GB of weights.
    SanaTransformerConfig one_block = SanaTransformerConfig::named("sana-600m");
    one_block.num_layers = 1;
    configs.emplace_back("sana-600m (1 block)", one_block);
    for (const auto& [name, config] : configs) {
        SanaTransformer model(config);
        EXPECT_EQ(sana_parameter_count(config), sf::model::parameter_count(*model)) << name;
    }

    // Upstream's totals. The Sana paper (arXiv 2410.10629, table of model sizes) gives 590M and
    // 1604M; diffusers counts every parameter of SanaTransformer2DModel, as we do here.
    const int64_t small = sana_parameter_count(SanaTransformerConfig::named("sana-600m"));
    const int64_t large = sana_parameter_count(SanaTransformerConfig::named("sana-1600m"));
    std::printf("[ params   ] sana-600m  %lld (paper: 590M)\n", static_cast<long long>(small));
    std::printf("[ params   ] sana-1600m %lld (paper: 1604M)\n", static_cast<long long>(large));
    std::printf(
        "[ params   ] sana-tiny  %lld\n",
        static_cast<long long>(sana_parameter_count(SanaTransformerConfig::named("sana-tiny"))));
    EXPECT_EQ(small, 591747872);
    EXPECT_EQ(large, 1604462752);
    EXPECT_NEAR(static_cast<double>(small), 590e6, 0.01 * 590e6);
    EXPECT_EQ(std::llround(static_cast<double>(large) / 1e6), 1604);
}

}  // namespace
