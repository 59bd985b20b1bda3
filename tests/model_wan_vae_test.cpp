// AutoencoderKLWan (Wan2.1's causal video VAE): upstream golden encode and decode of a 9-frame
// clip and of a one-frame image, causality (a prefix's latents are a prefix), streaming frame by
// frame equal to the whole clip, memory held between chunks independent of the clip's length,
// tiling, the config file, encoder-only loading and the analytic parameter count.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/weights.h"
#include "model/wan/autoencoder_kl_wan.h"
#include "model_golden_util.h"
#include "test_util.h"

namespace {

using sf::model::AutoencoderKLWan;
using sf::model::WanEncodeSession;
using sf::model::WanTiling;
using sf::model::WanVAEConfig;

using sf::test::kForwardAtol;
using sf::test::kForwardRtol;
constexpr double kDecodedAtol = 5e-5;  // decoded video: a deep stack of 3-D convolutions

std::string wan_dir() { return sf::test::golden_video_path("vae_wan"); }
using sf::test::video_ref_path;

AutoencoderKLWan golden_vae(bool with_decoder = true) {
    return sf::model::load_autoencoder_kl_wan(wan_dir(), with_decoder);
}

using sf::test::expect_invalid;

void check_golden(const std::string& file, const std::string& tag) {
    torch::NoGradGuard no_grad;
    auto vae = golden_vae();
    auto r = sf::test::load_ref(video_ref_path(file));
    const torch::Tensor params = vae->encode(r.at("video"));
    sf::test::expect_close(params, r.at("latent_params"), kForwardRtol, kForwardAtol,
                           tag + " latent_params");
    const torch::Tensor mean = vae->posterior_mean(params);
    sf::test::expect_close(mean, r.at("latent_mean"), kForwardRtol, kForwardAtol,
                           tag + " latent_mean");
    sf::test::expect_close(vae->posterior_logvar(params), r.at("latent_logvar"), kForwardRtol,
                           kForwardAtol, tag + " latent_logvar");
    sf::test::expect_close(vae->normalize_latent(mean), r.at("latent_normalized"), kForwardRtol,
                           kForwardAtol, tag + " latent_normalized");
    // Decoded from upstream's mean, so the decoder is checked on its own.
    sf::test::expect_close(vae->decode(r.at("latent_mean"), /*clamp=*/false),
                           r.at("decoded_unclamped"), 0.0, kDecodedAtol,
                           tag + " decoded_unclamped");
    sf::test::expect_close(vae->decode(r.at("latent_mean")), r.at("decoded"), 0.0, kDecodedAtol,
                           tag + " decoded");
}

TEST(WanVAEGolden, NineFrameClipEncodesAndDecodesAsUpstream) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    check_golden("vae_wan_encode_decode.safetensors", "9 frames");
}

TEST(WanVAEGolden, AnImageIsAOneFrameVideo) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    check_golden("vae_wan_encode_decode_image.safetensors", "1 frame");
}

TEST(WanVAEGolden, NormalisationRoundTripsAndUsesTheConfigLists) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    auto vae = golden_vae();
    auto r = sf::test::load_ref(video_ref_path("vae_wan_encode_decode.safetensors"));
    const auto& c = vae->config();
    for (int64_t i = 0; i < c.z_dim; ++i) {
        EXPECT_FLOAT_EQ(r.at("latents_mean")[i].item<float>(),
                        static_cast<float>(c.latents_mean[i]));
        EXPECT_FLOAT_EQ(r.at("latents_std")[i].item<float>(), static_cast<float>(c.latents_std[i]));
    }
    const auto back = vae->denormalize_latent(vae->normalize_latent(r.at("latent_mean")));
    EXPECT_TRUE(torch::allclose(back, r.at("latent_mean"), 1e-6, 1e-6));
}

TEST(WanVAE, NarrowConvolutionsOverStackedTimeTapsEqualConv3d) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(2);
    for (int64_t channels : {3, 16, 32}) {  // stacked (3 x 3, 16 x 3 <= 64) and not (32 x 3)
        sf::model::wan::CausalConv3d conv(channels, 8, std::array<int64_t, 3>{3, 3, 3},
                                          std::array<int64_t, 3>{1, 1, 1},
                                          std::array<int64_t, 3>{1, 1, 1});
        const auto x = torch::randn({2, channels, 5, 12, 10});
        const auto want =
            torch::conv3d(torch::constant_pad_nd(x, {1, 1, 1, 1, 2, 0}), conv->weight, conv->bias);
        const auto got = conv(x);
        EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5))
            << channels << " channels: " << (got - want).abs().max().item<double>();
    }
}

TEST(WanVAE, EncodingIsCausalAPrefixGivesAPrefixOfTheLatents) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae(false);
    auto video =
        sf::test::load_ref(video_ref_path("vae_wan_encode_decode.safetensors")).at("video");
    const auto all = vae->encode(video);
    ASSERT_EQ(all.size(2), 3);
    EXPECT_TRUE(torch::equal(vae->encode(video.slice(2, 0, 1)), all.slice(2, 0, 1)));
    EXPECT_TRUE(torch::equal(vae->encode(video.slice(2, 0, 5)), all.slice(2, 0, 2)));
    // The chunks see each other: encoding frames 0, 4 and 8 as separate clips differs.
    const auto alone = vae->encode(video.slice(2, 4, 5));
    EXPECT_GT((alone - all.slice(2, 1, 2)).abs().max().item<double>(), 1e-3);
}

TEST(WanVAE, StreamingFramesOneAtATimeGivesWhatTheWholeClipGives) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae(false);
    torch::manual_seed(3);
    const auto video = torch::rand({1, 3, 13, 16, 24}) * 2 - 1;
    const auto whole = vae->encode(video);
    WanEncodeSession session(*vae);
    std::vector<torch::Tensor> parts;
    std::vector<int64_t> ready_after;  // frames pushed when each latent frame came out
    for (int64_t t = 0; t < video.size(2); ++t) {
        auto out = session.push(video.slice(2, t, t + 1));
        EXPECT_EQ(session.complete(), t % 4 == 0) << "frame " << t;
        if (out.defined()) {
            parts.push_back(out);
            ready_after.push_back(t + 1);
        }
    }
    EXPECT_EQ(ready_after, (std::vector<int64_t>{1, 5, 9, 13}));
    EXPECT_TRUE(torch::equal(torch::cat(parts, 2), whole));
    // Uneven pieces: 3 frames, then 10.
    WanEncodeSession pieces(*vae);
    const auto a = pieces.push(video.slice(2, 0, 3));
    const auto b = pieces.push(video.slice(2, 3, 13));
    EXPECT_TRUE(torch::equal(torch::cat({a, b}, 2), whole));
}

TEST(WanVAE, MemoryHeldBetweenChunksDoesNotGrowWithTheClip) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae(false);
    torch::manual_seed(4);
    WanEncodeSession session(*vae);
    std::vector<int64_t> held;
    for (int64_t chunk = 0; chunk < 12; ++chunk) {
        session.push(torch::rand({1, 3, chunk == 0 ? 1 : 4, 16, 24}) * 2 - 1);
        held.push_back(session.held_bytes());
    }
    EXPECT_EQ(session.latent_frames(), 12);
    // The caches fill over the first two chunks (a one-frame chunk keeps one frame), then stay.
    for (size_t i = 2; i < held.size(); ++i) EXPECT_EQ(held[i], held[1]) << "chunk " << i;
    EXPECT_GT(held[1], 0);
}

TEST(WanVAE, RefusesFrameCountsUpstreamWouldCutAndBadShapes) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae(false);
    expect_invalid([&] { vae->encode(torch::zeros({1, 3, 7, 16, 24})); }, {"1 + 4 k", "got 7"});
    expect_invalid([&] { vae->encode(torch::zeros({1, 3, 5, 12, 24})); }, {"multiples of 8"});
    expect_invalid([&] { vae->decode(torch::zeros({1, 8, 1, 2, 3})); }, {"without its decoder"});
    WanEncodeSession session(*vae);
    session.push(torch::zeros({1, 3, 1, 16, 24}));
    expect_invalid([&] { session.push(torch::zeros({1, 3, 1, 16, 32})); }, {"a frame of"});
}

TEST(WanVAE, TiledEncodeOfOneTileIsTheUntiledEncodeAndStreamsTheSame) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae(false);
    torch::manual_seed(5);
    const auto video = torch::rand({1, 3, 5, 32, 40}) * 2 - 1;
    const WanTiling whole_frame{32, 40, 32, 40};
    EXPECT_TRUE(torch::equal(vae->encode(video, &whole_frame), vae->encode(video)));

    // 32 x 40 px in 16 px tiles at 8 px steps: a 4 x 5 grid, latent tiles of 2 kept 1, blended
    // over 1 latent px (weight 0: the seam takes the upper / left tile's value).
    const WanTiling small{16, 16, 8, 8};
    const auto tiled = vae->encode(video, &small);
    ASSERT_EQ(tiled.sizes(), (std::vector<int64_t>{1, 16, 2, 4, 5}));
    const auto t00 = vae->encode(video.slice(3, 0, 16).slice(4, 0, 16));
    EXPECT_TRUE(torch::equal(tiled.select(3, 0).select(3, 0), t00.select(3, 0).select(3, 0)));
    // Each tile carries its own causal cache: frame by frame gives the same.
    WanEncodeSession session(*vae, &small);
    std::vector<torch::Tensor> parts;
    for (int64_t t = 0; t < 5; ++t) {
        auto out = session.push(video.slice(2, t, t + 1));
        if (out.defined()) parts.push_back(out);
    }
    EXPECT_TRUE(torch::equal(torch::cat(parts, 2), tiled));
    const WanTiling uneven{16, 16, 12, 8};
    expect_invalid([&] { WanEncodeSession bad(*vae, &uneven); }, {"stride 12"});
}

// Upstream's tiled_decode: a tiling no smaller than the frame decodes whole; otherwise each tile of
// latents decodes alone, the first rows and columns of a tile fade in from its upper and left
// neighbours' last ones over tile - stride pixels, and each is cropped to the stride. Checked
// here against the tiles decoded one by one (diffusers itself: tests/python/ecosystem_test.py).
// The decoder's activations are a tile's, not the frame's.
TEST(WanVAE, TiledDecodeIsTheTilesBlendedAsUpstreamWithATilesMemory) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto vae = golden_vae();
    torch::manual_seed(6);
    const auto z = torch::randn({1, 8, 2, 7, 9});  // 56 x 72 px, 5 frames
    const auto whole = vae->decode(z);
    const WanTiling frame{56, 72, 56, 72};
    EXPECT_TRUE(torch::equal(vae->decode(z, true, &frame), whole));

    // 32-px tiles (4 latent px) at 24-px steps (3): a 3 x 3 grid, 8 px blended.
    const WanTiling small{32, 32, 24, 24};
    const auto tiled = vae->decode(z, /*clamp=*/false, &small);
    ASSERT_EQ(tiled.sizes(), whole.sizes());
    auto tile = [&](int64_t i, int64_t j) {  // tile (i, j) decoded alone, unclamped
        return vae->decode(z.slice(3, 3 * i, 3 * i + 4).slice(4, 3 * j, 3 * j + 4), false);
    };
    const auto t00 = tile(0, 0), t01 = tile(0, 1), t10 = tile(1, 0);
    // The top-left tile's kept part is its own.
    EXPECT_TRUE(
        torch::equal(tiled.slice(3, 0, 24).slice(4, 0, 24), t00.slice(3, 0, 24).slice(4, 0, 24)));
    // Its right neighbour's first 8 columns fade from the left tile's last 8 (weight x / 8), the
    // rest are its own; likewise down the first column of tiles.
    for (int64_t x = 0; x < 8; ++x) {
        const double w = static_cast<double>(x) / 8;
        const auto right =
            t00.select(4, 24 + x).slice(3, 0, 24) * (1 - w) + t01.select(4, x).slice(3, 0, 24) * w;
        EXPECT_TRUE(torch::allclose(tiled.select(4, 24 + x).slice(3, 0, 24), right, 1e-6, 1e-7))
            << "column " << x;
        const auto below =
            t00.select(3, 24 + x).slice(3, 0, 24) * (1 - w) + t10.select(3, x).slice(3, 0, 24) * w;
        EXPECT_TRUE(torch::allclose(tiled.select(3, 24 + x).slice(3, 0, 24), below, 1e-6, 1e-7))
            << "row " << x;
    }
    EXPECT_TRUE(
        torch::equal(tiled.slice(3, 0, 24).slice(4, 32, 48), t01.slice(3, 0, 24).slice(4, 8, 24)));

    // A larger frame: the decoder's peak follows the tile (measured: 40.2 MB whole, 5.9 MB in
    // 32-px tiles, the output aside).
    const auto big = torch::randn({1, 8, 2, 24, 24});  // 192 x 192 px
    auto peak_of = [&](const WanTiling* t) {
        sf::mem::reset_peak();
        const int64_t before = sf::mem::cpu_stats().current;
        const auto out = vae->decode(big, true, t);
        return sf::mem::cpu_stats().peak - before - static_cast<int64_t>(out.nbytes());
    };
    const int64_t whole_peak = peak_of(nullptr), tiled_peak = peak_of(&small);
    EXPECT_LT(tiled_peak, whole_peak / 2) << whole_peak << " B whole, " << tiled_peak << " tiled";
}

TEST(WanVAEConfig, TheGoldenConfigFileIsTheNamedTinyConfig) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    const auto c = WanVAEConfig::from_json_file(wan_dir());
    EXPECT_EQ(c, WanVAEConfig::named("wan-vae-tiny"));
    EXPECT_EQ(c.spatial_compression_ratio(), 8);
    EXPECT_EQ(c.temporal_compression_ratio(), 4);
    EXPECT_EQ(c.latent_frames(81), 21);
    EXPECT_EQ(WanVAEConfig::from_json_text(c.to_json_text()), c);
}

TEST(WanVAEConfig, BadConfigsNameTheKey) {
    const std::string base = WanVAEConfig::named("wan-vae-tiny").to_json_text();
    auto with = [&](const std::string& key, const std::string& value) {
        auto j = nlohmann::json::parse(base);
        j[key] = nlohmann::json::parse(value);
        return j.dump();
    };
    expect_invalid([&] { WanVAEConfig::from_json_text(with("attn_scales", "[0.5]"), "v.json"); },
                   {"v.json", "attn_scales"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("is_residual", "true")); }, {"Wan2.2"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("latents_std", "[1, 2]")); },
                   {"latents_std", "z_dim = 8"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("temperal_downsample", "[true]")); },
                   {"temperal_downsample"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("temperal_downsample", "[1, 0, 0]")); },
                   {"temperal_downsample", "true or false"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("_class_name", "\"AutoencoderKL\"")); },
                   {"AutoencoderKLWan"});
    expect_invalid([&] { WanVAEConfig::from_json_text(with("z_dim", "0")); }, {"z_dim"});
}

TEST(WanVAE, EncoderOnlyLoadSkipsTheDecoderAndEncodesTheSame) {
    SF_REQUIRE_GOLDEN_VIDEO("vae_wan");
    torch::NoGradGuard no_grad;
    auto full = golden_vae(true);
    auto encoder = golden_vae(false);
    EXPECT_FALSE(encoder->has_decoder());
    const auto video = torch::rand({1, 3, 5, 16, 24}) * 2 - 1;
    EXPECT_TRUE(torch::equal(full->encode(video), encoder->encode(video)));
    EXPECT_LT(sf::model::parameter_count(*encoder), sf::model::parameter_count(*full));
}

TEST(WanVAE, AnalyticParameterCountEqualsTheModules) {
    auto narrow = WanVAEConfig::named("wan2.1-vae");
    narrow.base_dim = 8;  // Wan2.1's structure at a width that builds in no time
    for (const auto& config : {WanVAEConfig::named("wan-vae-tiny"), narrow}) {
        AutoencoderKLWan full(config);
        AutoencoderKLWan encoder_only(config, /*with_decoder=*/false);
        EXPECT_EQ(sf::model::wan_vae_parameter_count(config), sf::model::parameter_count(*full));
        EXPECT_EQ(sf::model::wan_vae_parameter_count(config, false),
                  sf::model::parameter_count(*encoder_only));
    }
    // Every tensor of the golden checkpoint is a parameter: its element count is the count.
    const auto checkpoint = sf::storage::SafetensorsCheckpoint::open(wan_dir());
    int64_t stored = 0;
    for (const auto& name : checkpoint.names()) {
        int64_t n = 1;
        for (int64_t d : checkpoint.info(name).shape) n *= d;
        stored += n;
    }
    EXPECT_EQ(sf::model::wan_vae_parameter_count(WanVAEConfig::named("wan-vae-tiny")), stored);
}

TEST(WanVAE, Wan21ParameterCount) {
    const auto config = WanVAEConfig::named("wan2.1-vae");
    const int64_t encoder = sf::model::wan_vae_parameter_count(config, false),
                  full = sf::model::wan_vae_parameter_count(config);
    std::printf("wan2.1-vae parameters: encoder %lld, total %lld\n",
                static_cast<long long>(encoder), static_cast<long long>(full));
    // 126.89 M fp32 parameters: the 508 MB of Wan2.1-T2V-1.3B-Diffusers' vae/ weights file.
    EXPECT_EQ(full, 126892531);
    EXPECT_EQ(encoder, 53596928);
    AutoencoderKLWan vae(config);  // 0.5 GB of fp32 weights: built to check the count
    EXPECT_EQ(sf::model::parameter_count(*vae), full);
    AutoencoderKLWan encoder_only(config, false);
    EXPECT_EQ(sf::model::parameter_count(*encoder_only), encoder);
}

}  // namespace
