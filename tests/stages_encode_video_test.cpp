// encode_video: the Wan VAE stage encodes a window pushed frame by frame exactly as the model
// encodes the whole clip, stores the normalised posterior mean, holds memory independent of the
// window's length, and refuses windows that are not 1 + 4k frames.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "model/wan/autoencoder_kl_wan.h"
#include "stages/encode/encode_video.h"
#include "storage/cache_schema.h"
#include "storage/tensor_convert.h"

namespace {

using sf::stages::EncodeVideoConfig;
using sf::stages::EncodeVideoStage;
namespace schema = sf::storage::schema;

EncodeVideoConfig tiny(uint64_t seed = 7) {
    EncodeVideoConfig c;
    c.model = {"", "wan-vae-tiny", seed};
    c.device = "cpu";
    return c;
}

// The built-in model as the stage builds it (same seed, same weights).
sf::model::AutoencoderKLWan reference(uint64_t seed = 7) {
    torch::manual_seed(seed);
    sf::model::AutoencoderKLWan m(sf::model::WanVAEConfig::named("wan-vae-tiny"), false);
    m->eval();
    return m;
}

TEST(EncodeVideoStage, AWindowPushedFrameByFrameIsTheModelsNormalisedMean) {
    torch::NoGradGuard no_grad;
    const EncodeVideoStage stage(tiny());
    auto session = stage.open();
    torch::manual_seed(1);
    const at::Tensor frames = torch::randint(0, 256, {9, 3, 16, 24}, torch::kByte);  // [T, 3, H, W]
    session->begin_window();
    for (int64_t t = 0; t < 9; ++t) session->push_frame(frames[t]);
    const at::Tensor latent = session->finish_window();
    ASSERT_EQ(latent.sizes(), (std::vector<int64_t>{8, 3, 2, 3}));

    auto vae = reference();
    // uint8 -> [-1, 1], [T, 3, H, W] -> [1, 3, T, H, W]
    const at::Tensor video =
        (frames.to(torch::kFloat) / 127.5 - 1.0).permute({1, 0, 2, 3}).unsqueeze(0);
    const at::Tensor want = vae->normalize_latent(vae->posterior_mean(vae->encode(video)))[0];
    EXPECT_TRUE(torch::allclose(latent, want, 1e-5, 1e-6))
        << (latent - want).abs().max().item<double>();

    // The next window starts clean: the same frames give the same latent.
    session->begin_window();
    for (int64_t t = 0; t < 9; ++t) session->push_frame(frames[t]);
    EXPECT_TRUE(torch::equal(session->finish_window(), latent));
}

TEST(EncodeVideoStage, MemoryHeldGrowsByOneLatentFramePerChunkOnly) {
    torch::NoGradGuard no_grad;
    const EncodeVideoStage stage(tiny());
    auto session = stage.open();
    session->begin_window();
    std::vector<int64_t> held;
    for (int64_t t = 0; t < 1 + 4 * 8; ++t) {
        session->push_frame(torch::full({3, 16, 24}, static_cast<uint8_t>(t * 7), torch::kByte));
        if (t % 4 == 0) held.push_back(session->held_bytes());
    }
    const int64_t latent_frame = 8 * 2 * 3 * 4;  // [C, 1, h, w] fp32
    for (size_t i = 3; i < held.size(); ++i) {
        EXPECT_EQ(held[i] - held[i - 1], latent_frame) << "chunk " << i;
    }
    EXPECT_EQ(session->finish_window().size(1), 9);
}

TEST(EncodeVideoStage, RefusesAWindowThatIsNotOnePlusFourK) {
    const EncodeVideoStage stage(tiny());
    auto session = stage.open();
    session->begin_window();
    for (int t = 0; t < 3; ++t) session->push_frame(torch::zeros({3, 16, 24}, torch::kByte));
    try {
        session->finish_window();
        FAIL() << "a 3-frame window was encoded";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("3 frames"), std::string::npos) << e.what();
    }
    // An image is a one-frame window.
    session->begin_window();
    session->push_frame(torch::zeros({3, 16, 24}, torch::kByte));
    EXPECT_EQ(session->finish_window().sizes(), (std::vector<int64_t>{8, 1, 2, 3}));
}

TEST(EncodeVideoStage, RecordsSayWhatTheLatentIsAndTheFingerprintNamesIt) {
    const EncodeVideoStage stage(tiny());
    const auto r =
        stage.record(torch::zeros({8, 3, 2, 3}), "clip.mp4", schema::Bucket{9, 16, 24}, "24:9");
    EXPECT_EQ(r.metadata.at(schema::kFrames), "24:9");
    EXPECT_EQ(r.metadata.at(schema::kLatentForm), schema::kLatentNormalizedMean);
    EXPECT_EQ(r.metadata.at(schema::kBucket), "9x16x24");
    EXPECT_EQ(r.metadata.at(schema::kStage), schema::kEncodeVideoVAEStage);
    EXPECT_EQ(stage.fingerprint().at("latent"), schema::kLatentNormalizedMean);
    // Other weights, another fingerprint.
    EXPECT_NE(EncodeVideoStage(tiny(8)).fingerprint(), stage.fingerprint());
    EncodeVideoConfig bad = tiny();
    bad.model.builtin = "wan-vae-huge";
    EXPECT_THROW(EncodeVideoStage{bad}, sf::Error);
}

}  // namespace
