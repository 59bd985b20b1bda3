#include "stages/encode/encode_video.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <optional>

#include "core/device_options.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/wan/autoencoder_kl_wan.h"
#include "stages/encode/resident_model.h"
#include "storage/tensor_convert.h"

namespace sf::stages {
namespace {

namespace schema = storage::schema;
constexpr const char* kVideoStage = schema::kEncodeVideoVAEStage;

model::WanTiling tiling() { return {}; }  // upstream's 256-px tiles at 192-px steps

class WanSession final : public EncodeVideoStage::Session {
public:
    WanSession(const EncodeVideoConfig& config, c10::Device device, c10::ScalarType dtype)
        : device_(device), dtype_(dtype), tile_above_(config.tile_above), model_(kVideoStage, [&] {
              model::LoadOptions options;
              options.dtype = dtype;
              model::AutoencoderKLWan m{nullptr};
              if (config.model.is_pretrained()) {
                  m = model::load_autoencoder_kl_wan(config.model.component_dir("vae"),
                                                     /*with_decoder=*/false, options);
              } else {
                  torch::manual_seed(config.model.seed);
                  m = model::AutoencoderKLWan(model::WanVAEConfig::named(config.model.builtin),
                                              /*with_decoder=*/false);
                  m->to(dtype);
                  m->eval();
              }
              m->to(device);
              return m;
          }) {}

    void begin_window() override {
        window_.reset();
        parts_.clear();
        tiled_ = false;
    }

    void push_frame(const at::Tensor& rgb) override {
        use_torch_threads();  // see encode_vae.cpp: graph workers run on threads of their own
        torch::NoGradGuard no_grad;
        if (!window_) {
            // The first frame decides the tiling for the window (every frame has its size).
            tiled_ = rgb.size(1) > tile_above_ || rgb.size(2) > tile_above_;
            static const model::WanTiling kTiling = tiling();
            window_.emplace(*model_.get(), tiled_ ? &kTiling : nullptr);
        }
        // uint8 [0, 255] -> [-1, 1] on the device; [3, H, W] -> [1, 3, 1, H, W]
        at::Tensor x = rgb.to(device_);
        x = rgb.scalar_type() == at::kByte ? x.to(dtype_).div_(127.5).sub_(1.0) : x.to(dtype_);
        at::Tensor out = window_->push(x.unsqueeze(0).unsqueeze(2));
        if (out.defined()) parts_.push_back(model_.get()->posterior_mean(out));
    }

    at::Tensor finish_window() override {
        if (!window_ || !window_->complete()) {
            const int64_t n = window_ ? window_->frames_pushed() : 0;
            window_.reset();
            parts_.clear();
            throw Error::InvalidArgument(
                fmt::format("encode_video: a window of {} frames; the Wan VAE encodes 1 + 4 k", n));
        }
        torch::NoGradGuard no_grad;
        at::Tensor mean = torch::cat(parts_, 2);  // [1, C, f, h, w]
        at::Tensor latent = model_.get()->normalize_latent(mean)[0].to(at::kCPU).contiguous();
        window_.reset();
        parts_.clear();
        return latent;
    }

    int64_t held_bytes() const override {
        int64_t n = window_ ? window_->held_bytes() : 0;
        for (const auto& p : parts_) n += static_cast<int64_t>(p.nbytes());
        return n;
    }

    int64_t compression_ratio() const override {
        return model_.get()->config().spatial_compression_ratio();
    }

private:
    c10::Device device_;
    c10::ScalarType dtype_;
    int64_t tile_above_;
    mutable ResidentModel<model::AutoencoderKLWan> model_;
    std::optional<model::WanEncodeSession> window_;
    std::vector<at::Tensor> parts_;  // latent frames of the open window, [1, C, 1, h, w] each
    bool tiled_ = false;
};

}  // namespace

EncodeVideoStage::EncodeVideoStage(EncodeVideoConfig config) : config_(std::move(config)) {
    if (config_.tile_above < 256) {
        throw Error::InvalidArgument(fmt::format(
            "video VAE tile_above must be >= 256 (a tile), got {}", config_.tile_above));
    }
    const c10::ScalarType dtype = resolve_dtype(config_.mixed_precision);
    if (!config_.model.is_pretrained())
        model::WanVAEConfig::named(config_.model.builtin);  // validates the name
    const model::WanTiling t = tiling();
    fingerprint_ = {
        {"stage", kVideoStage},
        {"weights", weights_fingerprint(config_.model, "vae")},
        {"dtype", dtype_tag(dtype)},
        {"tile_above", std::to_string(config_.tile_above)},
        {"tiling",
         fmt::format("{}x{}/{}x{}", t.tile_height, t.tile_width, t.stride_height, t.stride_width)},
        {"latent", schema::kLatentNormalizedMean},
        {"chunking", "causal-1+4k"},
    };
    fingerprint_hash_ = storage::fingerprint_hash(fingerprint_);
}

EncodeVideoStage::~EncodeVideoStage() = default;

std::unique_ptr<EncodeVideoStage::Session> EncodeVideoStage::open() const {
    return std::make_unique<WanSession>(config_, resolve_device(config_.device),
                                        resolve_dtype(config_.mixed_precision));
}

storage::Record EncodeVideoStage::record(const at::Tensor& latent, const std::string& source,
                                         const schema::Bucket& bucket,
                                         const std::string& frames) const {
    storage::Record r;
    r.tensors[schema::kLatent] = storage::to_tensor_data(latent);
    r.metadata[schema::kSource] = source;
    r.metadata[schema::kBucket] = bucket.name();
    if (!frames.empty()) r.metadata[schema::kFrames] = frames;
    r.metadata[schema::kDType] = dtype_tag(latent.scalar_type());
    r.metadata[schema::kStage] = kVideoStage;
    r.metadata[schema::kLatentForm] = schema::kLatentNormalizedMean;
    r.metadata[schema::kFingerprint] = fingerprint_hash_;
    return r;
}

}  // namespace sf::stages
