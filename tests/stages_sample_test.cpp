// Validation sampling: the Euler sigmas are diffusers' FlowMatchEulerDiscreteScheduler's, the
// sampler integrates a flow exactly where Euler is exact, and guidance combines the transformer's
// two velocities as Sana's pipeline does, batched or not.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "model/sana/sana_transformer.h"
#include "stages/sample/flow_sampler.h"

namespace {

using sf::sample::euler_sigmas;

// What diffusers 0.36's FlowMatchEulerDiscreteScheduler(shift=s).set_timesteps(n) puts in
// .sigmas (printed by the project's .venv; float32 there, hence the tolerance).
TEST(FlowSampler, SigmasAreFlowMatchEulerDiscretes) {
    struct Case {
        double shift;
        int64_t steps;
        std::vector<double> upstream;
    };
    const Case cases[] = {
        {3.0, 4, {1.0, 0.857692301273346, 0.602150559425354, 0.008928571827709675, 0.0}},
        {1.0, 3, {1.0, 0.5005000233650208, 0.0010000000474974513, 0.0}},
        {2.5, 1, {1.0, 0.0}},
    };
    for (const Case& c : cases) {
        const std::vector<double> ours = euler_sigmas(c.steps, c.shift);
        ASSERT_EQ(ours.size(), c.upstream.size()) << c.shift;
        for (size_t i = 0; i < ours.size(); ++i)
            EXPECT_NEAR(ours[i], c.upstream[i], 1e-6) << "shift " << c.shift << " sigma " << i;
    }
    EXPECT_THROW(euler_sigmas(0, 3.0), sf::Error);
    EXPECT_THROW(euler_sigmas(4, std::nan("")), sf::Error);
    EXPECT_THROW(euler_sigmas(4, -1.0), sf::Error);
}

// On a straight path x(sigma) = (1 - sigma) x0 + sigma noise the velocity noise - x0 is the same
// at every point, so Euler lands on x0 from any schedule; a wrong sign or step size would not.
TEST(FlowSampler, EulerFollowsAStraightFlowToItsEnd) {
    torch::manual_seed(5);
    const at::Tensor x0 = torch::randn({2, 4, 3, 3});
    const at::Tensor noise = torch::randn({2, 4, 3, 3});
    int64_t calls = 0;
    const sf::sample::Velocity v = [&](const at::Tensor& x, const at::Tensor& t) {
        ++calls;
        EXPECT_EQ(t.sizes(), (at::IntArrayRef{2}));
        const double sigma = t[0].item<double>() / 1000;
        return (x - x0) / sigma;  // = noise - x0 on the path
    };
    const auto sigmas = euler_sigmas(7, 3.0);
    const at::Tensor x = sf::sample::euler_sample(v, noise, sigmas);
    EXPECT_EQ(calls, 7);
    EXPECT_TRUE(torch::allclose(x, x0, 1e-4, 1e-5)) << (x - x0).abs().max().item<double>();
}

// Guidance g: v_empty + g (v_caption - v_empty), the two run as one batch of the empty prompt
// and the caption padded to the longer; g <= 1 is the caption alone.
TEST(FlowSampler, GuidanceCombinesTheEmptyAndTheCaptionedVelocity) {
    auto config = sf::model::SanaTransformerConfig::named("sana-tiny");
    config.caption_channels = 16;
    torch::manual_seed(3);
    sf::model::SanaTransformer model(config);
    model->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({1, 32, 8, 8});
    const at::Tensor t = torch::full({1}, 700.0);
    const at::Tensor caption = torch::randn({1, 5, 16});
    const at::Tensor mask = torch::ones({1, 5}, torch::kLong);
    const at::Tensor empty = torch::randn({3, 16});
    const at::Tensor v_caption = model->forward(x, caption, t, mask);
    const at::Tensor v_empty =
        model->forward(x, empty.unsqueeze(0), t, torch::ones({1, 3}, torch::kLong));
    const double g = 4.5;
    const at::Tensor guided = sf::sample::guided_velocity(*model, caption, mask, empty, g)(x, t);
    EXPECT_TRUE(torch::allclose(guided, v_empty + g * (v_caption - v_empty), 1e-4, 1e-5))
        << (guided - (v_empty + g * (v_caption - v_empty))).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(sf::sample::guided_velocity(*model, caption, mask, empty, 1.0)(x, t),
                             v_caption));
    EXPECT_FALSE(torch::allclose(v_caption, v_empty, 1e-3, 1e-3)) << "the caption does nothing";
}

}  // namespace
