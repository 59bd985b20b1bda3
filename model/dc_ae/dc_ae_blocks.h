// The building blocks of DC-AE (diffusers v0.33.1 autoencoder_dc.py and the modules it imports),
// each registering its parameters under upstream's names:
//   ResBlock                       conv1, conv2, norm
//   EfficientViTBlock              attn (SanaMultiscaleLinearAttention), conv_out (GLUMBConv)
//   SanaMultiscaleLinearAttention  to_q, to_k, to_v, to_qkv_multiscale.N.{proj_in,proj_out},
//                                  to_out, norm_out
//   GLUMBConv                      conv_inverted, conv_depth, conv_point, norm
//   DCDownBlock2d / DCUpBlock2d    conv
// They live in their own namespace: the Sana transformer has a GLUMBConv of its own.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace sf::model::dc_ae {

// diffusers' get_activation: "silu"/"swish", "relu", "gelu" (erf), "mish".
enum class Activation { kSiLU, kReLU, kGELU, kMish };
Activation activation_from_name(const std::string& name);
torch::Tensor activate(const torch::Tensor& x, Activation act);

// diffusers' RMSNorm(C, eps, elementwise_affine=True, bias=True) applied across the channels of
// an NCHW tensor. Upstream moves the channels last and back; reducing over dim 1 is the same
// arithmetic and keeps the tensor NCHW-contiguous for the convolution that follows.
class ChannelRMSNormImpl : public torch::nn::Module {
public:
    ChannelRMSNormImpl(int64_t channels, double eps);
    torch::Tensor forward(const torch::Tensor& x);

    torch::Tensor weight, bias;

private:
    double eps_;
};
TORCH_MODULE(ChannelRMSNorm);

// get_normalization(norm_type, C) on NCHW: "rms_norm" (per pixel, across channels) or
// "batch_norm" (BatchNorm2d: running statistics in eval mode, as upstream). Registers one module
// under `name` on `parent`, so its keys are `<name>.weight`, `<name>.running_mean`, ...
class ChannelNorm {
public:
    ChannelNorm() = default;
    ChannelNorm(torch::nn::Module& parent, const std::string& name, const std::string& norm_type,
                int64_t channels);
    torch::Tensor operator()(const torch::Tensor& x);

private:
    ChannelRMSNorm rms_{nullptr};
    torch::nn::BatchNorm2d batch_{nullptr};
};

class ResBlockImpl : public torch::nn::Module {
public:
    ResBlockImpl(int64_t channels, const std::string& norm_type, Activation act);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};

private:
    ChannelNorm norm_;
    Activation act_;
};
TORCH_MODULE(ResBlock);

// SanaMultiscaleAttentionProjection: a depthwise k x k conv then a 1x1 conv grouped per head, on
// the concatenated q, k, v channels.
class MultiscaleProjectionImpl : public torch::nn::Module {
public:
    MultiscaleProjectionImpl(int64_t inner_dim, int64_t heads, int64_t kernel_size);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Conv2d proj_in{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(MultiscaleProjection);

// Which attention SanaMultiscaleAttnProcessor2_0 runs: ReLU linear attention, or, when the map
// has no more pixels than a head has channels (H*W <= head_dim), the quadratic form, which is
// cheaper there. Counted for tests.
// Atomic: a frozen encoder may be shared by threads.
struct AttentionCalls {
    std::atomic<int64_t> linear{0};
    std::atomic<int64_t> quadratic{0};
};

// SanaMultiscaleLinearAttention with residual_connection=True, mult 1.
class MultiscaleLinearAttentionImpl : public torch::nn::Module {
public:
    MultiscaleLinearAttentionImpl(int64_t channels, int64_t head_dim,
                                  const std::vector<int64_t>& kernel_sizes,
                                  const std::string& norm_type,
                                  std::shared_ptr<AttentionCalls> calls = nullptr);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
    torch::nn::ModuleList to_qkv_multiscale{nullptr};

private:
    int64_t head_dim_;
    ChannelNorm norm_out_;
    std::shared_ptr<AttentionCalls> calls_;
};
TORCH_MODULE(MultiscaleLinearAttention);

// GLUMBConv(C, C, expand_ratio 4, norm_type "rms_norm", residual_connection=True).
class GLUMBConvImpl : public torch::nn::Module {
public:
    explicit GLUMBConvImpl(int64_t channels);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Conv2d conv_inverted{nullptr}, conv_depth{nullptr}, conv_point{nullptr};
    ChannelRMSNorm norm{nullptr};
};
TORCH_MODULE(GLUMBConv);

class EfficientViTBlockImpl : public torch::nn::Module {
public:
    EfficientViTBlockImpl(int64_t channels, int64_t head_dim,
                          const std::vector<int64_t>& kernel_sizes, const std::string& norm_type,
                          std::shared_ptr<AttentionCalls> calls = nullptr);
    torch::Tensor forward(const torch::Tensor& x);

    MultiscaleLinearAttention attn{nullptr};
    GLUMBConv conv_out{nullptr};
};
TORCH_MODULE(EfficientViTBlock);

// DCDownBlock2d: halves H and W. `pixel_unshuffle`: a 3x3 conv to C_out / 4 then unshuffle;
// otherwise a stride-2 3x3 conv. The shortcut unshuffles the input and averages channel groups.
class DownBlockImpl : public torch::nn::Module {
public:
    DownBlockImpl(int64_t in_channels, int64_t out_channels, bool pixel_unshuffle, bool shortcut);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Conv2d conv{nullptr};

private:
    bool pixel_unshuffle_, shortcut_;
    int64_t out_channels_, group_size_;
};
TORCH_MODULE(DownBlock);

// DCUpBlock2d: doubles H and W. `interpolate`: nearest 2x then a 3x3 conv; otherwise a 3x3 conv
// to 4 C_out then pixel shuffle. The shortcut repeats input channels and pixel-shuffles them.
class UpBlockImpl : public torch::nn::Module {
public:
    UpBlockImpl(int64_t in_channels, int64_t out_channels, bool interpolate, bool shortcut);
    torch::Tensor forward(const torch::Tensor& x);

    torch::nn::Conv2d conv{nullptr};

private:
    bool interpolate_, shortcut_;
    int64_t repeats_;
};
TORCH_MODULE(UpBlock);

}  // namespace sf::model::dc_ae
