#include "stages/encode/encode_vae.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/device_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "model/dc_ae/autoencoder_dc.h"
#include "stages/encode/resident_model.h"
#include "storage/cache.h"
#include "storage/cache_schema.h"
#include "storage/tensor_convert.h"

namespace sf::stages {
namespace {

namespace schema = storage::schema;
constexpr const char* kVaeStage = schema::kEncodeVAEStage;

class DCAESession final : public EncodeVAEStage::Session {
public:
    DCAESession(const EncodeVAEConfig& config, c10::Device device, c10::ScalarType dtype)
        : device_(device), dtype_(dtype), tile_above_(config.tile_above), model_(kVaeStage, [&] {
              model::LoadOptions options;
              options.dtype = dtype;
              model::AutoencoderDC m{nullptr};
              if (config.model.is_pretrained()) {
                  m = model::load_autoencoder_dc(config.model.component_dir("vae"),
                                                 /*with_decoder=*/false, options);
              } else {
                  torch::manual_seed(config.model.seed);
                  m = model::AutoencoderDC(model::AutoencoderDCConfig::named(config.model.builtin),
                                           /*with_decoder=*/false);
                  m->to(dtype);
                  m->eval();
              }
              m->to(device);
              return m;
          }) {
        ratio_ = model_.get()->spatial_compression_ratio();
    }

    std::vector<at::Tensor> encode(const std::vector<at::Tensor>& images) override {
        // The graph calls this from its own worker threads; OpenMP's thread count is per calling
        // thread, and a worker that never set it runs LibTorch's kernels on one thread (measured:
        // 8x slower for the tiny DC-AE, bench_prep).
        use_torch_threads();
        torch::NoGradGuard no_grad;
        std::vector<at::Tensor> batch;
        for (const auto& img : images) {
            // uint8 [0, 255] -> [-1, 1] on the device, so a quarter of the bytes cross the bus.
            at::Tensor x = img.to(device_);
            x = img.scalar_type() == at::kByte ? x.to(dtype_).div_(127.5).sub_(1.0) : x.to(dtype_);
            batch.push_back(x);
        }
        at::Tensor x = torch::stack(batch);  // [B, 3, H, W]
        auto& vae = model_.get();
        const bool tiled = x.size(2) > tile_above_ || x.size(3) > tile_above_;
        at::Tensor z = tiled ? vae->encode_tiled(x) : vae->encode(x);  // [B, C, H / r, W / r]
        z = vae->scale_latent(z).to(at::kCPU);
        std::vector<at::Tensor> out;
        for (int64_t i = 0; i < z.size(0); ++i) out.push_back(z[i].contiguous());
        return out;
    }

    int64_t compression_ratio() const override { return ratio_; }

private:
    c10::Device device_;
    c10::ScalarType dtype_;
    int64_t tile_above_;
    int64_t ratio_ = 0;
    ResidentModel<model::AutoencoderDC> model_;
};

}  // namespace

EncodeVAEStage::EncodeVAEStage(EncodeVAEConfig config) : config_(std::move(config)) {
    if (config_.batch_size < 1)
        throw Error::InvalidArgument(
            fmt::format("VAE batch size must be >= 1, got {}", config_.batch_size));
    if (config_.tile_above < 512) throw Error::InvalidArgument("VAE tile_above must be >= 512");
    const c10::ScalarType dtype = resolve_dtype(config_.mixed_precision);
    if (!config_.model.is_pretrained())
        model::AutoencoderDCConfig::named(config_.model.builtin);  // validates the name
    fingerprint_ = {
        {"stage", kVaeStage},        {"weights", weights_fingerprint(config_.model, "vae")},
        {"dtype", dtype_tag(dtype)}, {"tile_above", std::to_string(config_.tile_above)},
        {"latent", "scaled"},
    };
    fingerprint_hash_ = storage::fingerprint_hash(fingerprint_);
}

EncodeVAEStage::~EncodeVAEStage() = default;

std::unique_ptr<EncodeVAEStage::Session> EncodeVAEStage::open() const {
    return std::make_unique<DCAESession>(config_, resolve_device(config_.device),
                                         resolve_dtype(config_.mixed_precision));
}

storage::Record EncodeVAEStage::record(const at::Tensor& latent, const std::string& source,
                                       const schema::Bucket& bucket) const {
    storage::Record r;
    r.tensors[schema::kLatent] = storage::to_tensor_data(latent);
    r.metadata[schema::kSource] = source;
    r.metadata[schema::kBucket] = bucket.name();
    r.metadata[schema::kDType] = dtype_tag(latent.scalar_type());
    r.metadata[schema::kStage] = kVaeStage;
    r.metadata[schema::kLatentForm] = schema::kLatentScaled;
    r.metadata[schema::kFingerprint] = fingerprint_hash_;
    return r;
}

}  // namespace sf::stages
