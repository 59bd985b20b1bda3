#include "stages/sample/decode_latents.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <optional>

#include "core/error.h"
#include "model/dc_ae/autoencoder_dc.h"
#include "model/wan/autoencoder_kl_wan.h"
#include "model/wan/wan_vae_config.h"
#include "stages/encode/resident_model.h"

namespace sf::sample {

namespace {

// The built-in model as prep builds its encoder (stages/encode/encode_vae.cpp, encode_video.cpp):
// the encoder's weights are drawn first, so they are prep's, and the decoder's follow. The global
// generator is left as it was: validation must not change what training draws.
template <typename Vae, typename Build>
Vae build_builtin(int64_t seed, const Build& build) {
    at::Generator global = at::detail::getDefaultCPUGenerator();
    const at::Tensor saved = global.get_state();
    torch::manual_seed(seed);
    Vae m = build();
    global.set_state(saved);
    m->eval();
    return m;
}

model::AutoencoderDC build_dc_ae(const stages::ModelSource& source, c10::Device device) {
    model::AutoencoderDC m =
        source.is_pretrained()
            ? model::load_autoencoder_dc(source.component_dir("vae"), /*with_decoder=*/true)
            : build_builtin<model::AutoencoderDC>(source.seed, [&] {
                  return model::AutoencoderDC(model::AutoencoderDCConfig::named(source.builtin),
                                              /*with_decoder=*/true);
              });
    m->to(device);
    return m;
}

model::AutoencoderKLWan build_wan(const stages::ModelSource& source, c10::Device device) {
    model::AutoencoderKLWan m =
        source.is_pretrained()
            ? model::load_autoencoder_kl_wan(source.component_dir("vae"), /*with_decoder=*/true)
            : build_builtin<model::AutoencoderKLWan>(source.seed, [&] {
                  return model::AutoencoderKLWan(model::WanVAEConfig::named(source.builtin),
                                                 /*with_decoder=*/true);
              });
    m->to(device);
    return m;
}

at::Tensor to_pixels(const at::Tensor& decoded) {
    return decoded.clamp(-1, 1).add(1).mul(127.5).round().to(at::kByte).to(at::kCPU);
}

}  // namespace

struct LatentDecoder::Model {
    std::optional<stages::ResidentModel<model::AutoencoderDC>> dc_ae;
    std::optional<stages::ResidentModel<model::AutoencoderKLWan>> wan;
};

LatentDecoder::LatentDecoder(const stages::ModelSource& source, c10::Device device, Kind kind)
    : model_(std::make_unique<Model>()), device_(device), kind_(kind) {
    if (kind == Kind::kWan) {
        model_->wan.emplace("decode_vae", [&] { return build_wan(source, device); });
    } else {
        model_->dc_ae.emplace("decode_vae", [&] { return build_dc_ae(source, device); });
    }
}

LatentDecoder::~LatentDecoder() = default;

at::Tensor LatentDecoder::decode(const at::Tensor& latents, bool tiled) {
    torch::NoGradGuard no_grad;
    const at::Tensor z = latents.to(device_, at::kFloat);
    if (kind_ == Kind::kWan) {
        auto& vae = model_->wan->get();
        const model::WanTiling tiling;  // upstream's 256-px tiles at 192-px steps
        return to_pixels(
            vae->decode(vae->denormalize_latent(z), /*clamp=*/true, tiled ? &tiling : nullptr));
    }
    auto& vae = model_->dc_ae->get();
    const at::Tensor unscaled = vae->unscale_latent(z);
    return to_pixels(tiled ? vae->decode_tiled(unscaled) : vae->decode(unscaled));
}

}  // namespace sf::sample
