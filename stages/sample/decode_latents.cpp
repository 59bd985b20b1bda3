#include "stages/sample/decode_latents.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "model/dc_ae/autoencoder_dc.h"
#include "stages/encode/resident_model.h"

namespace sf::sample {

namespace {

model::AutoencoderDC build_vae(const stages::ModelSource& source, c10::Device device) {
    model::AutoencoderDC m{nullptr};
    if (source.is_pretrained()) {
        m = model::load_autoencoder_dc(source.component_dir("vae"), /*with_decoder=*/true);
    } else {
        // As prep builds the encoder (stages/encode/encode_vae.cpp): the encoder's weights are
        // drawn first, so they are prep's, and the decoder's follow. The global generator is
        // left as it was: validation must not change what training draws.
        at::Generator global = at::detail::getDefaultCPUGenerator();
        const at::Tensor saved = global.get_state();
        torch::manual_seed(source.seed);
        m = model::AutoencoderDC(model::AutoencoderDCConfig::named(source.builtin),
                                 /*with_decoder=*/true);
        global.set_state(saved);
        m->eval();
    }
    m->to(device);
    return m;
}

}  // namespace

struct LatentDecoder::Model {
    Model(const stages::ModelSource& source, c10::Device device)
        : vae("decode_vae", [&] { return build_vae(source, device); }) {}
    stages::ResidentModel<model::AutoencoderDC> vae;
};

LatentDecoder::LatentDecoder(const stages::ModelSource& source, c10::Device device)
    : model_(std::make_unique<Model>(source, device)), device_(device) {}

LatentDecoder::~LatentDecoder() = default;

at::Tensor LatentDecoder::decode(const at::Tensor& latents, bool tiled) {
    torch::NoGradGuard no_grad;
    auto& vae = model_->vae.get();
    const at::Tensor z = vae->unscale_latent(latents.to(device_, at::kFloat));
    const at::Tensor image = tiled ? vae->decode_tiled(z) : vae->decode(z);
    return image.clamp(-1, 1).add(1).mul(127.5).round().to(at::kByte).to(at::kCPU);
}

}  // namespace sf::sample
