// Training parts: AdamW against torch::optim::AdamW, schedules, clipping, the loss scaler, the
// flow-matching noise, the bucketed sampler, checkpoints, and TrainStep's remedies (accumulation,
// fused backward pass, loss scaling, out-of-memory messages).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <set>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "core/memory.h"
#include "model/common/lora.h"
#include "model/sana/sana_transformer.h"
#include "stages/train/auto_fit.h"
#include "stages/train/flow_matching.h"
#include "stages/train/host_worker.h"
#include "stages/train/optim.h"
#include "stages/train/prior_pairs.h"
#include "stages/train/prodigy.h"
#include "stages/train/quantized_state.h"
#include "stages/train/train_data.h"
#include "stages/train/train_state.h"
#include "stages/train/train_step.h"
#include "storage/fault_injection.h"
#include "test_util.h"
#include "train_test_util.h"

namespace {

using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;

// Every parameter of a model without adapters, by name.
std::vector<std::pair<std::string, at::Tensor>> named(torch::nn::Module& m) {
    return sf::model::trainable_parameters(m);
}

SanaTransformerConfig small_config() {
    SanaTransformerConfig c = SanaTransformerConfig::named("sana-tiny");
    c.caption_channels = 16;
    return c;
}

SanaTransformer seeded_model(uint64_t seed = 3) {
    torch::manual_seed(seed);
    return SanaTransformer(small_config());
}

// Two samples of 8x8 latents with 5- and 3-token captions.
sf::train::MicroBatch sample_batch(int64_t n = 2) {
    torch::manual_seed(11);
    sf::train::MicroBatch b;
    b.latents = torch::randn({n, 32, 8, 8});
    b.prompt_embeds = torch::randn({n, 5, 16});
    b.prompt_mask = torch::ones({n, 5}, torch::kLong);
    if (n > 1) b.prompt_mask[1].slice(0, 3).fill_(0);
    return b;
}

sf::train::MicroBatch slice(const sf::train::MicroBatch& b, int64_t i) {
    return {b.latents.slice(0, i, i + 1), b.prompt_embeds.slice(0, i, i + 1),
            b.prompt_mask.slice(0, i, i + 1)};
}

sf::train::TrainStep make_step(SanaTransformer model, sf::train::TrainStepOptions o,
                               double lr = 1e-3) {
    auto params = named(*model);
    sf::train::AdamWOptions a;
    a.lr = lr;
    return sf::train::TrainStep(model.ptr(), params, a,
                                sf::train::LRSchedule("constant", lr, 0, 100), o,
                                c10::Device(c10::kCPU));
}

TEST(AdamW, MatchesTorchOptimBitForBit) {
    torch::manual_seed(0);
    auto a = torch::randn({7, 5}, torch::requires_grad());
    auto b = torch::randn({5}, torch::requires_grad());
    auto a2 = a.detach().clone().requires_grad_(true);
    auto b2 = b.detach().clone().requires_grad_(true);
    sf::train::AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.05;
    sf::train::AdamW ours({{"a", a}, {"b", b}}, o);
    torch::optim::AdamW theirs({a2, b2}, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
    for (int step = 0; step < 4; ++step) {
        auto x = torch::randn({3, 7});
        ours.zero_grad();
        theirs.zero_grad();
        (x.matmul(a).add(b).tanh().sum()).backward();
        (x.matmul(a2).add(b2).tanh().sum()).backward();
        ours.step(o.lr);
        theirs.step();
    }
    EXPECT_TRUE(torch::equal(a, a2));
    EXPECT_TRUE(torch::equal(b, b2));
}

TEST(AdamW, StateRoundTripsAndRefusesWrongShapes) {
    auto a = torch::ones({3}, torch::requires_grad());
    sf::train::AdamW opt({{"a", a}}, {});
    a.mutable_grad() = torch::full({3}, 0.5);
    opt.step(0.1);
    auto state = opt.state();
    EXPECT_EQ(state.at("a.step").item<int64_t>(), 1);
    auto a2 = a.detach().clone().requires_grad_(true);
    sf::train::AdamW opt2({{"a", a2}}, {});
    opt2.load_state(state);
    a.mutable_grad() = torch::full({3}, -0.25);
    a2.mutable_grad() = torch::full({3}, -0.25);
    opt.step(0.1);
    opt2.step(0.1);
    EXPECT_TRUE(torch::equal(a, a2));
    state["a.exp_avg"] = torch::zeros({4});
    EXPECT_THROW(opt2.load_state(state), sf::Error);
}

// prodigyopt's Prodigy.step (one group, slice_p 1), transcribed in double precision on plain
// tensors, as the reference the optimizer is held to.
struct ProdigyReference {
    sf::train::AdamWOptions o;
    std::vector<at::Tensor> p, m, v, s, p0;
    double d, d_max, numerator = 0;
    int k = 0;

    ProdigyReference(const std::vector<at::Tensor>& params, sf::train::AdamWOptions options)
        : o(options), d(options.prodigy.d0), d_max(options.prodigy.d0) {
        for (const auto& t : params) {
            p.push_back(t.to(at::kDouble).clone());
            m.push_back(torch::zeros_like(p.back()));
            v.push_back(torch::zeros_like(p.back()));
            s.push_back(torch::zeros({t.numel()}, at::kDouble));
            p0.push_back(p.back().flatten().clone());  // zeros stay zeros either way
        }
    }
    void step(std::vector<at::Tensor> grads, double lr) {
        const auto& q = o.prodigy;
        const double beta3 = q.beta3 > 0 ? q.beta3 : std::sqrt(o.beta2);
        const double bc = q.use_bias_correction ? std::sqrt(1 - std::pow(o.beta2, k + 1)) /
                                                      (1 - std::pow(o.beta1, k + 1))
                                                : 1.0;
        const double dlr = d * lr * bc;
        double num = numerator * beta3, den = 0;
        for (size_t i = 0; i < p.size(); ++i) {
            at::Tensor g = grads[i].to(at::kDouble);
            if (o.weight_decay != 0 && !q.decouple) g = g + o.weight_decay * p[i];
            num += (d / q.d0) * dlr * at::dot(g.flatten(), p0[i] - p[i].flatten()).item<double>();
            m[i] = m[i] * o.beta1 + g * (d * (1 - o.beta1));
            v[i] = v[i] * o.beta2 + g * g * (d * d * (1 - o.beta2));
            s[i] = s[i] * beta3 + g.flatten() * ((d / q.d0) * (q.safeguard_warmup ? d : dlr));
            den += s[i].abs().sum().item<double>();
        }
        const double d_hat = q.d_coef * num / den;
        if (d == q.d0) d = std::max(d, d_hat);
        d_max = std::max(d_max, d_hat);
        d = std::min(d_max, d * (q.growth_rate > 0 ? q.growth_rate : INFINITY));
        numerator = num;
        for (size_t i = 0; i < p.size(); ++i) {
            if (o.weight_decay != 0 && q.decouple) p[i] = p[i] - o.weight_decay * dlr * p[i];
            p[i] = p[i] - dlr * m[i] / (v[i].sqrt() + d * o.eps);
        }
        ++k;
    }
};

// Prodigy against the transcription: every combination of its switches, with weight decay, a
// parameter that starts at zero (LoRA's B: its p0 is kept as a scalar), 6 steps with a warmup.
TEST(Prodigy, StepsAsProdigyoptDoesInEveryMode) {
    int grew = 0;  // modes whose estimate left d0 within the 6 steps (measured: 5 of 8)
    for (int mode = 0; mode < 8; ++mode) {
        sf::train::AdamWOptions o;
        o.weight_decay = 0.05;
        o.prodigy.enabled = true;
        o.prodigy.decouple = mode & 1;
        o.prodigy.use_bias_correction = mode & 2;
        o.prodigy.safeguard_warmup = mode & 4;
        if (mode == 5) o.prodigy.growth_rate = 1.5;
        if (mode == 6) o.prodigy.beta3 = 0.9;
        SCOPED_TRACE("mode " + std::to_string(mode));
        torch::manual_seed(2);
        // In fp64: p0 - p is a difference of nearly equal numbers, which fp32 rounds to a few
        // digits (prodigyopt's too), so only fp64 compares the arithmetic itself.
        const auto f64 = torch::TensorOptions(torch::kDouble);
        std::vector<at::Tensor> init = {torch::randn({4, 3}, f64), torch::zeros({5}, f64),
                                        torch::randn({2, 2, 2}, f64)};
        std::vector<std::pair<std::string, at::Tensor>> params;
        for (size_t i = 0; i < init.size(); ++i)
            params.emplace_back("p" + std::to_string(i), init[i].clone().requires_grad_(true));
        sf::train::Prodigy prodigy(params, o);
        ProdigyReference reference(init, o);
        for (int step = 0; step < 6; ++step) {
            const double lr = step < 2 ? 0.5 * (step + 1) : 1.0;
            // Towards a target, with noise: a direction for the estimate to grow along.
            std::vector<at::Tensor> grads;
            for (const auto& [name, t] : params)
                grads.push_back(t.detach() - 3.0 + 0.1 * torch::randn(t.sizes(), f64));
            for (size_t i = 0; i < params.size(); ++i)
                params[i].second.mutable_grad() = grads[i].clone();
            prodigy.step(lr);
            reference.step(grads, lr);
        }
        EXPECT_NEAR(prodigy.d(), reference.d, 1e-9 * reference.d);
        EXPECT_GE(prodigy.d(), o.prodigy.d0);
        grew += prodigy.d() > 2 * o.prodigy.d0;
        for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_TRUE(torch::allclose(params[i].second.detach(), reference.p[i], 1e-10, 1e-12))
                << params[i].first;
        }
    }
    EXPECT_GE(grew, 4) << "the estimate hardly moved: its update was not exercised";
}

// On a least-squares problem with --learning_rate 1, Prodigy finds a step size on its own: d
// grows from 1e-6 by orders of magnitude and the loss falls, where AdamW at Prodigy's initial
// step size does not move. Its state resumes bit-identically; other state is refused; another
// rank's parameter is left alone.
TEST(Prodigy, FindsItsStepSizeAndResumesExactly) {
    torch::manual_seed(4);
    const at::Tensor a = torch::randn({32, 8}), b = torch::randn({32});
    auto loss_of = [&](const at::Tensor& x) { return 0.5 * (at::mv(a, x) - b).pow(2).sum(); };
    auto run = [&](sf::train::Optimizer& opt, const at::Tensor& x, int steps) {
        for (int i = 0; i < steps; ++i) {
            opt.zero_grad();
            loss_of(x).backward();
            opt.step(1.0);
        }
        return loss_of(x).item<double>();
    };
    sf::train::AdamWOptions o;
    o.weight_decay = 0;
    o.prodigy.enabled = true;
    const at::Tensor x0 = torch::zeros({8});
    const double start = loss_of(x0).item<double>();
    at::Tensor x = x0.clone().requires_grad_(true);
    sf::train::Prodigy prodigy({{"x", x}}, o);
    const double after = run(prodigy, x, 200);
    const double best = loss_of(at::linalg_solve(a.t().mm(a), a.t().mv(b))).item<double>();
    EXPECT_GT(prodigy.d(), 1e-3);  // measured: 0.023
    EXPECT_LT(after - best, 1e-3 * (start - best)) << "not at the least-squares minimum";
    sf::train::AdamWOptions slow = o;
    slow.lr = 1e-6;
    at::Tensor y = x0.clone().requires_grad_(true);
    sf::train::AdamW adamw({{"x", y}}, slow);
    for (int i = 0; i < 200; ++i) {
        adamw.zero_grad();
        loss_of(y).backward();
        adamw.step(1e-6);
    }
    EXPECT_GT(loss_of(y).item<double>() - best, 0.99 * (start - best));

    // Resume: 3 steps, state saved, 3 more; against a fresh optimizer given the state.
    at::Tensor u = x0.clone().requires_grad_(true);
    sf::train::Prodigy first({{"x", u}}, o);
    run(first, u, 3);
    std::map<std::string, at::Tensor> saved;
    for (const auto& [name, t] : first.state()) saved[name] = t.clone();
    const at::Tensor at3 = u.detach().clone();
    run(first, u, 3);
    at::Tensor w = at3.clone().requires_grad_(true);
    sf::train::Prodigy second({{"x", w}}, o);
    second.load_state(saved);
    run(second, w, 3);
    EXPECT_TRUE(torch::equal(u.detach(), w.detach()));
    EXPECT_EQ(first.d(), second.d());
    sf::train::AdamW other({{"x", w}}, o);
    other.zero_grad();
    loss_of(w).backward();
    other.step(1.0);
    sf::test::expect_error([&] { second.load_state(other.state()); },
                           sf::ErrorCode::kInvalidArgument, "x.s is missing");
    // Another rank's parameter (ZeRO-1) is not stepped and keeps no state.
    second.set_owned({false});
    const at::Tensor before = w.detach().clone();
    run(second, w, 1);
    EXPECT_TRUE(torch::equal(w.detach(), before));
    EXPECT_EQ(second.state().count("x.s"), 0u);
    sf::train::AdamWOptions zero = o;
    zero.lr = 0;
    sf::test::expect_error(
        [&] {
            sf::train::Prodigy({{"x", w}}, zero);
        },
        sf::ErrorCode::kInvalidArgument, "--learning_rate");
}

TEST(LRSchedule, FollowsDiffusersShapes) {
    EXPECT_DOUBLE_EQ(sf::train::LRSchedule("constant", 1.0, 10, 100).at(0), 1.0);
    sf::train::LRSchedule warm("constant_with_warmup", 2.0, 4, 100);
    EXPECT_DOUBLE_EQ(warm.at(0), 0.0);
    EXPECT_DOUBLE_EQ(warm.at(2), 1.0);
    EXPECT_DOUBLE_EQ(warm.at(50), 2.0);
    sf::train::LRSchedule cosine("cosine", 1.0, 10, 110);
    EXPECT_DOUBLE_EQ(cosine.at(10), 1.0);
    EXPECT_NEAR(cosine.at(60), 0.5, 1e-12);
    EXPECT_NEAR(cosine.at(110), 0.0, 1e-12);
    EXPECT_NEAR(sf::train::LRSchedule("linear", 1.0, 0, 100).at(25), 0.75, 1e-12);
    // cosine_with_restarts: num_cycles hard restarts over the steps after the warmup.
    sf::train::LRSchedule restarts("cosine_with_restarts", 1.0, 0, 10, /*num_cycles=*/2);
    EXPECT_NEAR(restarts.at(2), 0.5 * (1.0 + std::cos(M_PI * 0.4)), 1e-12);
    EXPECT_NEAR(restarts.at(5), 1.0, 1e-12);  // the restart
    EXPECT_NEAR(restarts.at(7), 0.5 * (1.0 + std::cos(M_PI * 0.4)), 1e-12);
    EXPECT_EQ(restarts.at(10), 0.0);
    // polynomial: from the peak to lr_end 1e-7 with `power`, then lr_end.
    sf::train::LRSchedule poly("polynomial", 1.0, 2, 10, 1, /*power=*/2.0);
    EXPECT_DOUBLE_EQ(poly.at(1), 0.5);
    EXPECT_NEAR(poly.at(6), (1.0 - 1e-7) * 0.25 + 1e-7, 1e-15);
    EXPECT_NEAR(poly.at(10), 1e-7, 1e-15);
    EXPECT_NEAR(poly.at(50), 1e-7, 1e-15);
    for (const auto& bad : {std::make_pair("cosine_restarts", "--lr_scheduler"),
                            std::make_pair("polynomial-low-lr", "--learning_rate")}) {
        try {
            if (std::string(bad.first) == "polynomial-low-lr") {
                sf::train::LRSchedule("polynomial", 1e-8, 0, 10);
            } else {
                sf::train::LRSchedule(bad.first, 1.0, 0, 10);
            }
            FAIL() << bad.first;
        } catch (const sf::Error& e) {
            EXPECT_NE(std::string(e.what()).find(bad.second), std::string::npos) << e.what();
        }
    }
}

TEST(ClipGradNorm, ScalesToTheGlobalNorm) {
    auto a = torch::zeros({2}, torch::requires_grad());
    auto b = torch::zeros({1}, torch::requires_grad());
    a.mutable_grad() = torch::tensor({3.0f, 0.0f});
    b.mutable_grad() = torch::tensor({4.0f});
    EXPECT_NEAR(sf::train::clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
    EXPECT_NEAR(a.grad()[0].item<float>(), 0.6f, 1e-5);
    EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-5);
    EXPECT_NEAR(sf::train::clip_grad_norm({a, b}, 10.0), 1.0, 1e-5);  // under the limit: unchanged
    EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-5);
}

TEST(LossScaler, SkipsOnInfBacksOffAndGrows) {
    sf::train::LossScalerOptions o;
    o.init_scale = 1024;
    o.growth_interval = 2;
    sf::train::LossScaler scaler(true, o);
    auto p = torch::zeros({2}, torch::requires_grad());
    p.mutable_grad() = torch::tensor({2048.0f, std::numeric_limits<float>::infinity()});
    EXPECT_FALSE(scaler.unscale({p}));
    scaler.update(true);
    EXPECT_EQ(scaler.scale(), 512);
    EXPECT_EQ(scaler.skipped_steps(), 1);
    p.mutable_grad() = torch::tensor({1024.0f, 512.0f});
    EXPECT_TRUE(scaler.unscale({p}));
    EXPECT_FLOAT_EQ(p.grad()[0].item<float>(), 2.0f);  // divided by the scale
    scaler.update(false);
    scaler.update(false);
    EXPECT_EQ(scaler.scale(), 1024);  // grown after growth_interval clean steps
    sf::train::LossScaler restored(true, o);
    restored.load_state(scaler.state());
    EXPECT_EQ(restored.scale(), 1024);
    EXPECT_EQ(restored.skipped_steps(), 1);
}

TEST(FlowMatching, BatchDrawsWhatItsSamplesDrawOneByOne) {
    const auto latents = torch::randn({3, 4, 2, 2});
    sf::train::FlowMatchingConfig c;
    at::Generator g1 = at::detail::createCPUGenerator(5), g2 = at::detail::createCPUGenerator(5);
    const auto whole = sf::train::flow_matching_noise(latents, c, g1);
    for (int64_t i = 0; i < 3; ++i) {
        const auto one = sf::train::flow_matching_noise(latents.slice(0, i, i + 1), c, g2);
        EXPECT_TRUE(torch::equal(one.noisy[0], whole.noisy[i]));
        EXPECT_TRUE(torch::equal(one.timesteps[0], whole.timesteps[i]));
    }
    // x_t interpolates from the data (sigma 0) to the noise (sigma 1); the target is their
    // difference; timesteps are sigma * 1000 and the shift pushes sigma up.
    const auto noise = whole.target + latents;
    const auto sig = whole.sigmas.view({3, 1, 1, 1});
    EXPECT_TRUE(torch::allclose(whole.noisy, (1 - sig) * latents + sig * noise, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(whole.timesteps, whole.sigmas * 1000));
    EXPECT_TRUE((whole.sigmas > 0).all().item<bool>() && (whole.sigmas <= 1).all().item<bool>());
    c.flow_shift = 0;
    EXPECT_THROW(sf::train::check_flow_matching(c), sf::Error);
}

// Upstream's weighting schemes (diffusers' compute_density_for_timestep_sampling and
// compute_loss_weighting_for_sd3): "mode" reshapes the uniform draw, "sigma_sqrt" and "cosmap"
// weight the squared error by their functions of sigma, "none" is the plain uniform draw.
TEST(FlowMatching, WeightingSchemesDrawAndWeighAsUpstream) {
    const auto latents = torch::randn({4, 4, 2, 2});
    auto noised = [&](const std::string& scheme, double mode_scale = 1.29) {
        sf::train::FlowMatchingConfig c;
        c.weighting_scheme = scheme;
        c.mode_scale = mode_scale;
        sf::train::check_flow_matching(c);
        at::Generator g = at::detail::createCPUGenerator(11);
        return sf::train::flow_matching_noise(latents, c, g);
    };
    // The draws: per sample u then its noise, so the first draw of sample 0 is its u.
    at::Generator g = at::detail::createCPUGenerator(11);
    const double v = at::rand({1}, g).item<double>();
    auto sigma_of = [](double u) {
        const double index = std::min(std::floor(u * 1000), 999.0), s = (1000 - index) / 1000;
        return 3.0 * s / (1 + 2.0 * s);
    };
    EXPECT_NEAR(noised("none").sigmas[0].item<double>(), sigma_of(v), 1e-6);
    const double mode_u = 1 - v - 1.29 * (std::pow(std::cos(M_PI * v / 2), 2) - 1 + v);
    EXPECT_NEAR(noised("mode").sigmas[0].item<double>(), sigma_of(mode_u), 1e-6);
    EXPECT_FALSE(noised("none").loss_weights.defined());
    EXPECT_FALSE(noised("mode").loss_weights.defined());

    const auto sq = noised("sigma_sqrt");
    EXPECT_TRUE(torch::allclose(sq.loss_weights, sq.sigmas.pow(-2)));
    const auto cm = noised("cosmap");
    EXPECT_TRUE(
        torch::allclose(cm.loss_weights, 2 / (M_PI * (1 - 2 * cm.sigmas + 2 * cm.sigmas.pow(2)))));
    // The loss: mean over each sample of w (prediction - target)^2, then over the batch.
    const auto prediction = torch::randn(latents.sizes());
    const auto expected = (sq.loss_weights.view({4, 1, 1, 1}) * (prediction - sq.target).pow(2))
                              .mean({1, 2, 3})
                              .mean();
    EXPECT_NEAR(
        sf::train::flow_matching_loss(prediction, sq.target, {}, sq.loss_weights).item<double>(),
        expected.item<double>(), 1e-4 * expected.item<double>());
    sf::train::FlowMatchingConfig bad;
    bad.weighting_scheme = "sigmoid";
    try {
        sf::train::check_flow_matching(bad);
        FAIL();
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("--weighting_scheme must be none, logit_normal, mode"),
                  std::string::npos);
    }
}

// --repeats: an epoch hands out every sample that many times, in batches of one bucket; the
// copies are shuffled in with the others rather than following each other.
TEST(BucketSampler, RepeatedSamplesComeThatManyTimesAnEpoch) {
    using sf::train::Bucket;
    const std::map<Bucket, std::vector<int64_t>> buckets = {{Bucket{1, 512, 512}, {0, 1, 2, 3, 4}},
                                                            {Bucket{21, 480, 832}, {5, 6, 7}}};
    const auto repeated = sf::train::repeat_samples(buckets, 3);
    sf::train::BucketSampler sampler(repeated, 2, 9);
    EXPECT_EQ(sampler.batches_per_epoch(), 8 + 5);  // 15 / 2 and 9 / 2, rounded up
    for (int epoch = 0; epoch < 2; ++epoch) {
        std::multiset<int64_t> seen;
        std::vector<int64_t> order;
        for (int b = 0; b < sampler.batches_per_epoch(); ++b) {
            const auto batch = sampler.next();
            for (int64_t i : batch) {
                EXPECT_EQ(i < 5, batch.front() < 5) << "a batch mixes buckets";
                seen.insert(i);
                order.push_back(i);
            }
        }
        for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(seen.count(i), 3u) << "sample " << i;
        // Shuffled: not every copy straight after the one before.
        int adjacent = 0;
        for (size_t k = 1; k < order.size(); ++k) adjacent += order[k] == order[k - 1];
        EXPECT_LT(adjacent, 8) << "epoch " << epoch;
    }
    EXPECT_EQ(sf::train::repeat_samples(buckets, 1), buckets);
    sf::test::expect_error([&] { sf::train::repeat_samples(buckets, 0); },
                           sf::ErrorCode::kInvalidArgument, "--repeats");
    sf::test::expect_error([&] { sf::train::repeat_samples(buckets, 20'000'000); },
                           sf::ErrorCode::kInvalidArgument, "--repeats 20000000 over 8 samples");
}

// Upstream's DreamBoothDataset has max(instances, class images) items, item i pairing instance
// i mod n with class image i mod m; here per bucket, the first --num_class_images class samples.
TEST(PriorPairs, EachBucketPairsAsUpstreamsDatasetWithTheFirstClassSamples) {
    using sf::train::Bucket;
    const Bucket a{1, 512, 512}, b{1, 384, 640}, c{1, 640, 384};
    const std::map<Bucket, std::vector<int64_t>> instances = {{a, {0, 1, 2}}, {b, {3}}};
    const std::map<Bucket, std::vector<int64_t>> classes = {{a, {0, 2, 4, 5, 6}}, {b, {1, 3}}};
    const auto all = sf::train::pair_with_class_samples(instances, classes, 0);
    // Buckets in name order: b (384x640) before a (512x512).
    const std::vector<std::pair<int64_t, int64_t>> expected = {
        {3, 1}, {3, 3},                           // b: 2 class samples, the one instance twice
        {0, 0}, {1, 2}, {2, 4}, {0, 5}, {1, 6}};  // a: 5 class samples, the instances cycled
    EXPECT_EQ(all.pairs, expected);
    EXPECT_EQ(all.buckets.at(b), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(all.buckets.at(a), (std::vector<int64_t>{2, 3, 4, 5, 6}));
    // The first 3 class samples (0, 1, 2): a keeps 0 and 2, b keeps 1; a has 3 pairs, the
    // instances' count.
    const auto first3 = sf::train::pair_with_class_samples(instances, classes, 3);
    const std::vector<std::pair<int64_t, int64_t>> limited = {{3, 1}, {0, 0}, {1, 2}, {2, 0}};
    EXPECT_EQ(first3.pairs, limited);
    // A bucket of instances without a class sample of its shape is named.
    sf::test::expect_error(
        [&] {
            sf::train::pair_with_class_samples({{a, {0}}, {c, {1, 2}}}, classes, 0);
        },
        sf::ErrorCode::kInvalidArgument, c.name() + " (2 instance samples)");
}

// The joined batch: instance samples first, then class samples, captions padded to the longer;
// its weighted mean loss is upstream's instance loss + prior_loss_weight x class loss (with a
// weighting scheme's per-sample weights too).
TEST(PriorPairs, TheJoinedLossIsTheInstanceLossPlusTheWeightedClassLoss) {
    torch::manual_seed(5);
    auto batch = [](int64_t n, int64_t tokens) {
        sf::train::TrainingBatch b;
        b.latents = torch::randn({n, 4, 8, 8});
        b.prompt_embeds = torch::randn({n, tokens, 16});
        b.prompt_mask = torch::ones({n, tokens}, torch::kLong);
        for (int64_t i = 0; i < n; ++i) b.indices.push_back(i);
        return b;
    };
    const auto instances = batch(2, 5), classes = batch(3, 7);
    const double w = 0.7;
    const auto joined = sf::train::join_prior_batch(instances, classes, w);
    ASSERT_EQ(joined.batch.latents.sizes(), (std::vector<int64_t>{5, 4, 8, 8}));
    EXPECT_TRUE(torch::equal(joined.batch.latents.slice(0, 0, 2), instances.latents));
    EXPECT_TRUE(torch::equal(joined.batch.latents.slice(0, 2), classes.latents));
    ASSERT_EQ(joined.batch.prompt_embeds.sizes(), (std::vector<int64_t>{5, 7, 16}));
    EXPECT_TRUE(torch::equal(joined.batch.prompt_embeds.slice(0, 0, 2).slice(1, 0, 5),
                             instances.prompt_embeds));
    EXPECT_EQ(joined.batch.prompt_embeds.slice(0, 0, 2).slice(1, 5).abs().sum().item<float>(), 0);
    EXPECT_TRUE(torch::equal(joined.batch.prompt_mask.sum(1),
                             torch::tensor({5, 5, 7, 7, 7}, torch::kLong)));
    EXPECT_EQ(joined.batch.indices, instances.indices);

    const at::Tensor prediction = torch::randn({5, 4, 8, 8}), target = torch::randn({5, 4, 8, 8});
    for (const bool weighting : {false, true}) {
        SCOPED_TRACE(weighting ? "with a weighting scheme" : "without");
        const at::Tensor scheme = weighting ? torch::rand({5}) + 0.5 : at::Tensor();
        auto mean_loss = [&](int64_t from, int64_t to) {  // upstream: per sample, then the mean
            at::Tensor sq = (prediction.slice(0, from, to) - target.slice(0, from, to)).pow(2);
            if (weighting) sq = sq * scheme.slice(0, from, to).view({-1, 1, 1, 1});
            return sq.reshape({to - from, -1}).mean(1).mean().item<double>();
        };
        const double upstream = mean_loss(0, 2) + w * mean_loss(2, 5);
        const double ours = sf::train::flow_matching_loss(prediction, target, at::Tensor(), scheme,
                                                          joined.sample_weights)
                                .item<double>();
        EXPECT_NEAR(ours, upstream, 1e-6 * upstream);
    }
}

TEST(BucketSampler, EpochsCoverEverySampleOnceInSingleBucketBatches) {
    using sf::train::Bucket;
    std::map<Bucket, std::vector<int64_t>> buckets = {{Bucket{1, 512, 512}, {0, 1, 2, 3, 4}},
                                                      {Bucket{21, 480, 832}, {5, 6, 7}}};
    sf::train::BucketSampler sampler(buckets, 2, 9);
    EXPECT_EQ(sampler.batches_per_epoch(), 5);  // 3 + 2
    for (int epoch = 0; epoch < 2; ++epoch) {
        std::multiset<int64_t> seen;
        for (int b = 0; b < 5; ++b) {
            auto batch = sampler.next();
            const bool in_a = batch.front() < 5;
            for (int64_t i : batch) {
                EXPECT_EQ(i < 5, in_a) << "a batch mixes buckets";
                seen.insert(i);
            }
        }
        EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    }
    // A position restores the sequence exactly; another seed gives another order.
    sf::train::BucketSampler a(buckets, 2, 9), b(buckets, 2, 9), c(buckets, 2, 10);
    for (int i = 0; i < 7; ++i) a.next();
    b.seek(a.position());
    std::vector<std::vector<int64_t>> from_a, from_b, from_c;
    for (int i = 0; i < 6; ++i) {
        from_a.push_back(a.next());
        from_b.push_back(b.next());
    }
    EXPECT_EQ(from_a, from_b);
    sf::train::BucketSampler a0(buckets, 2, 9);
    std::vector<std::vector<int64_t>> first_a, first_c;
    for (int i = 0; i < 5; ++i) {
        first_a.push_back(a0.next());
        first_c.push_back(c.next());
    }
    EXPECT_NE(first_a, first_c);
}

TEST(TrainState, CheckpointsRoundTripAndKeepTheNewest) {
    sf::test::TempDir tmp("sf_train_state");
    sf::train::TrainState s;
    s.step = 3;
    s.sampler_epoch = 1;
    s.sampler_batch = 2;
    s.scaler = {{"scale", 128.0}, {"good_steps", 1.0}, {"skipped", 0.0}};
    s.settings = {{"rank", "4"}};
    s.trainable = {{"w", torch::arange(6, torch::kFloat).view({2, 3})}};
    s.optimizer = {{"w.exp_avg", torch::ones({2, 3})},
                   {"w.step", torch::scalar_tensor(3, torch::kLong)}};
    s.rng = {{"default", at::detail::getDefaultCPUGenerator().get_state()}};
    s.losses = {0.5, 0.25, 0.125000000001};
    const std::string out = tmp.file("out");
    sf::train::save_checkpoint(out, s, 2);
    s.step = 6;
    sf::train::save_checkpoint(out, s, 2);
    s.step = 9;
    const std::string last = sf::train::save_checkpoint(out, s, 2);
    EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-3"));  // beyond the limit of 2
    EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-6"));
    // A directory without state.json (a crash mid-save) is not a checkpoint.
    std::filesystem::create_directories(out + "/checkpoint-12");
    ASSERT_EQ(sf::train::latest_checkpoint(out), last);

    const sf::train::TrainState r = sf::train::load_checkpoint(last);
    EXPECT_EQ(r.step, 9);
    EXPECT_EQ(r.sampler_batch, 2);
    EXPECT_EQ(r.losses, s.losses);  // exact doubles
    EXPECT_TRUE(torch::equal(r.trainable.at(0).second, s.trainable.at(0).second));
    EXPECT_EQ(r.optimizer.at("w.step").item<int64_t>(), 3);
    EXPECT_TRUE(torch::equal(r.rng.at("default"), s.rng.at("default")));
    EXPECT_EQ(r.settings, s.settings);
}

TEST(TrainState, LatestSkipsDamagedCheckpointsAndEveryFieldIsChecked) {
    namespace fs = std::filesystem;
    sf::test::TempDir tmp("sf_train_state");
    sf::train::TrainState s;
    s.trainable = {{"w", torch::arange(6, torch::kFloat)}};
    s.rng = {{"default", at::detail::getDefaultCPUGenerator().get_state()}};
    const std::string out = tmp.file("out");
    s.step = 2;
    const std::string two = sf::train::save_checkpoint(out, s, 0);
    s.step = 4;
    const std::string four = sf::train::save_checkpoint(out, s, 0);
    EXPECT_EQ(sf::train::latest_checkpoint(out), four);
    // Names that are no step are not checkpoints, even when they overflow.
    fs::create_directories(out + "/checkpoint-99999999999999999999");
    fs::create_directories(out + "/checkpoint--5");
    EXPECT_EQ(sf::train::latest_checkpoint(out), four);

    // A flipped byte in the newest: the previous one is chosen.
    std::string bytes = sf::test::read_file(four + "/trainable.safetensors");
    bytes[bytes.size() - 1] ^= 1;
    sf::test::write_file(four + "/trainable.safetensors", bytes);
    sf::test::expect_error([&] { sf::train::verify_checkpoint(four); }, sf::ErrorCode::kCorruption,
                           four + "/trainable.safetensors: ");
    EXPECT_EQ(sf::train::latest_checkpoint(out), two);
    // A newer one without its manifest (a crash mid-save, from an older version without files).
    fs::create_directories(out + "/checkpoint-6");
    EXPECT_EQ(sf::train::latest_checkpoint(out), two);

    // Every field of state.json, named.
    const std::string state = two + "/state.json";
    const std::string good = sf::test::read_file(state);
    // Replaces the first `from` after `after`.
    auto with = [&](const std::string& from, const std::string& to, const std::string& after = "") {
        std::string text = good;
        const size_t at = text.find(from, text.find(after));
        EXPECT_NE(at, std::string::npos) << from;
        text.replace(at, from.size(), to);
        sf::test::write_file(state, text);
        fs::remove(two + "/manifest.json");  // checked as a checkpoint of an earlier version
        return text;
    };
    with("\"step\": 2", "\"step\": -5");
    sf::test::expect_error([&] { sf::train::load_checkpoint(two); }, sf::ErrorCode::kCorruption,
                           state + ": \"step\" must be an integer >= 0, got -5");
    with("\"step\": 2", "\"step\": 99999999999999999999");
    sf::test::expect_error([&] { sf::train::load_checkpoint(two); }, sf::ErrorCode::kCorruption,
                           "\"step\" must be an integer >= 0");
    with("\"epoch\": 0", "\"epoch\": \"x\"", "\"sampler\"");
    sf::test::expect_error([&] { sf::train::load_checkpoint(two); }, sf::ErrorCode::kCorruption,
                           state + ": sampler: \"epoch\" must be an integer");
    with("\"epoch\": 0", "\"epoch\": -1", "\"image_sampler\"");
    sf::test::expect_error([&] { sf::train::load_checkpoint(two); }, sf::ErrorCode::kCorruption,
                           state + ": image_sampler: \"epoch\" must be an integer >= 0");
    with("\"version\": 1", "\"version\": " + std::string(100000, '['));
    sf::test::expect_error([&] { sf::train::load_checkpoint(two); }, sf::ErrorCode::kCorruption,
                           "nested deeper than 64");
    // No checkpoint verifies: refused rather than silently starting from step 0.
    sf::test::expect_error([&] { sf::train::latest_checkpoint(out); }, sf::ErrorCode::kCorruption,
                           "no intact checkpoint in " + out + " (3 damaged");
}

TEST(TrainState, ACheckpointWriteThatFailsLeavesThePreviousOneChosen) {
    namespace faults = sf::storage::faults;
    sf::test::TempDir tmp("sf_train_state_fault");
    sf::train::TrainState s;
    s.trainable = {{"w", torch::arange(6, torch::kFloat)}};
    const std::string out = tmp.file("out");
    s.step = 2;
    const std::string two = sf::train::save_checkpoint(out, s, 1);
    s.step = 4;
    // Each file of the checkpoint, at each step of its writing.
    for (const char* file : {"trainable", "optimizer", "state.json", "manifest.json"}) {
        for (faults::Op op : {faults::Op::kWrite, faults::Op::kFsync, faults::Op::kRename}) {
            faults::ScopedFault fault(faults::Fault{op, ENOSPC, file});
            EXPECT_THROW(sf::train::save_checkpoint(out, s, 1), sf::Error) << file;
            EXPECT_EQ(faults::fired(), 1) << file;
            EXPECT_EQ(sf::train::latest_checkpoint(out), two) << file;
            EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-4")) << file;
        }
    }
    // Room again: the next save is whole, and only then is the older one removed.
    EXPECT_EQ(sf::train::save_checkpoint(out, s, 1), out + "/checkpoint-4");
    EXPECT_FALSE(std::filesystem::exists(two));  // --checkpoints_total_limit 1, once 4 is whole
}

// --blocks_to_swap: the swapped blocks' weights stay in host memory and are lent to the device for
// each run (a real copy on the CPU too). Three steps of two micro-batches end with the very losses
// and weights of a run without swapping that checkpoints the same blocks (a swapped block always
// is); each block is lent twice per micro-batch (its forward and its backward's recompute), and
// all but the first lend of each pass are copied ahead (the block after it in the forward, the
// one before it in the recomputes); the weights stay the host tensors the optimizer updates.
TEST(BlockSwap, TrainsBitIdenticallyLendingEachSwappedBlockTwicePerMicroBatch) {
    const sf::train::MicroBatch batch = sample_batch(2);
    const int64_t blocks = small_config().num_layers, swapped = 2;
    ASSERT_GE(blocks, swapped);
    auto make = [&](int64_t swap, SanaTransformer model) {
        sf::train::AdamWOptions a;
        a.lr = 1e-2;
        sf::train::TrainStepOptions o;
        o.accumulation = 2;
        o.max_grad_norm = 1.0;
        o.blocks_to_swap = swap;
        o.gradient_checkpointing = swap > 0 ? 0 : 1;
        return std::make_unique<sf::train::TrainStep>(
            model.ptr(), named(*model), a, sf::train::LRSchedule("constant", 1e-2, 0, 1000), o,
            c10::Device(c10::kCPU));
    };
    auto plain = make(0, seeded_model()), swap = make(swapped, seeded_model());
    const at::Tensor host = swap->model().blocks().front()->parameters().front();
    const void* host_data = host.data_ptr();
    at::Generator g1 = at::detail::createCPUGenerator(4), g2 = at::detail::createCPUGenerator(4);
    for (int i = 0; i < 3; ++i) {
        const double a = plain->step([&](int64_t) { return batch; }, g1).loss;
        const double b = swap->step([&](int64_t) { return batch; }, g2).loss;
        EXPECT_EQ(a, b) << "step " << i + 1;
    }
    const auto p = named(plain->model().module()), q = named(swap->model().module());
    ASSERT_EQ(p.size(), q.size());
    for (size_t i = 0; i < p.size(); ++i)
        EXPECT_TRUE(torch::equal(p[i].second, q[i].second)) << p[i].first;
    const int64_t passes = 3 * 2;
    EXPECT_EQ(swap->model().block_swap().copies(), passes * 2 * swapped);
    EXPECT_EQ(swap->model().block_swap().copies_ahead(), passes * 2 * (swapped - 1));
    EXPECT_EQ(plain->model().block_swap().copies(), 0);
    EXPECT_EQ(host.data_ptr(), host_data) << "the update ran on the host weights";
    EXPECT_FALSE(torch::equal(host, named(*seeded_model()).front().second)) << "and moved them";

    sf::train::TrainStepOptions fused;
    fused.blocks_to_swap = 1;
    fused.fused_backward = true;
    SanaTransformer m = seeded_model();
    try {
        sf::train::TrainStep(m.ptr(), named(*m), {}, sf::train::LRSchedule("constant", 1e-3, 0, 10),
                             fused, c10::Device(c10::kCPU));
        ADD_FAILURE() << "--blocks_to_swap with --fused_backward_pass was accepted";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("--blocks_to_swap"), std::string::npos) << e.what();
    }
    sf::train::TrainStepOptions too_many;
    too_many.blocks_to_swap = blocks + 1;
    try {
        sf::train::TrainStep(m.ptr(), named(*m), {}, sf::train::LRSchedule("constant", 1e-3, 0, 10),
                             too_many, c10::Device(c10::kCPU));
        ADD_FAILURE() << "more blocks to swap than blocks";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("blocks"), std::string::npos) << e.what();
    }
}

// --offload_optimizer: the moments live in host memory and the update runs on host copies of the
// weights and gradients (real copies on the CPU too): five steps, in fp32 and in 8 bits, with the
// optimizer step and with the fused backward pass (whose host updates run on a worker thread
// beside the backward), end with the very weights and state of the resident optimizer, with
// three copies per update.
TEST(OffloadOptimizer, UpdatesOnTheHostBitIdenticallyWithThreeCopiesPerUpdate) {
    const sf::train::MicroBatch batch = sample_batch(2);
    for (bool fused : {false, true}) {
        for (bool eight_bit : {false, true}) {
            SCOPED_TRACE(testing::Message() << "fused " << fused << ", eight_bit " << eight_bit);
            auto make = [&](bool offload, SanaTransformer model) {
                sf::train::AdamWOptions a;
                a.lr = 1e-2;
                a.eight_bit = eight_bit;
                a.offload = offload;
                sf::train::TrainStepOptions o;
                o.fused_backward = fused;
                return std::make_unique<sf::train::TrainStep>(
                    model.ptr(), named(*model), a, sf::train::LRSchedule("constant", 1e-2, 0, 1000),
                    o, c10::Device(c10::kCPU));
            };
            auto resident = make(false, seeded_model()), offloaded = make(true, seeded_model());
            at::Generator g1 = at::detail::createCPUGenerator(2);
            at::Generator g2 = at::detail::createCPUGenerator(2);
            for (int i = 0; i < 5; ++i) {
                resident->step([&](int64_t) { return batch; }, g1);
                offloaded->step([&](int64_t) { return batch; }, g2);
            }
            const auto p = named(resident->model().module());
            const auto q = named(offloaded->model().module());
            for (size_t i = 0; i < p.size(); ++i)
                EXPECT_TRUE(torch::equal(p[i].second, q[i].second)) << p[i].first;
            const auto a = resident->optimizer().state(), b = offloaded->optimizer().state();
            ASSERT_EQ(a.size(), b.size());
            for (const auto& [name, t] : a) {
                EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
                EXPECT_TRUE(b.at(name).device().is_cpu()) << name;
            }
            const auto updates = 5 * static_cast<int64_t>(p.size());
            EXPECT_EQ(offloaded->adamw().offload_copies(), 3 * updates);
            EXPECT_EQ(resident->adamw().offload_copies(), 0);
            EXPECT_EQ(offloaded->adamw().overlapped_updates(), fused ? updates : 0);
            EXPECT_EQ(resident->adamw().overlapped_updates(), 0);
        }
    }
}

// The offloaded optimizer's worker: jobs run in order on another thread; wait() returns when they
// are done and rethrows the first failure, the jobs after it dropped; then it works again.
TEST(HostWorker, RunsJobsInOrderElsewhereAndRethrowsTheFirstFailure) {
    sf::train::HostWorker worker(/*max_pending_bytes=*/1 << 20);
    std::vector<int> ran;
    std::set<std::thread::id> threads;
    for (int i = 0; i < 100; ++i) {
        worker.submit(
            [&, i] {
                ran.push_back(i);
                threads.insert(std::this_thread::get_id());
            },
            1);
    }
    worker.wait();
    ASSERT_EQ(ran.size(), 100u);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
    EXPECT_EQ(threads.size(), 1u);
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);

    ran.clear();
    worker.submit([&] { ran.push_back(1); }, 1);
    worker.submit([] { throw std::runtime_error("update failed"); }, 1);
    worker.submit([&] { ran.push_back(3); }, 1);
    try {
        worker.wait();
        ADD_FAILURE() << "the failure was not rethrown";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "update failed");
    }
    EXPECT_EQ(ran, std::vector<int>{1});
    worker.submit([&] { ran.push_back(4); }, 1);
    worker.wait();
    EXPECT_EQ(ran, (std::vector<int>{1, 4}));
    EXPECT_EQ(worker.pending_bytes(), 0);
}

// What the queued jobs hold is bounded: a submit that would pass the bound waits until a job
// ends; one larger than the bound goes alone.
TEST(HostWorker, SubmitWaitsWhileTheQueuedJobsHoldTheBound) {
    sf::train::HostWorker worker(/*max_pending_bytes=*/100);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    worker.submit([released] { released.wait(); }, 60);
    EXPECT_EQ(worker.pending_bytes(), 60);
    std::atomic<bool> second_queued{false};
    std::thread producer([&] {
        worker.submit([] {}, 60);
        second_queued = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(second_queued) << "queued past the bound while the first job held 60 of 100";
    release.set_value();
    producer.join();
    EXPECT_TRUE(second_queued);
    worker.wait();
    EXPECT_EQ(worker.pending_bytes(), 0);
    bool ran = false;
    worker.submit([&] { ran = true; }, 1000);
    worker.wait();
    EXPECT_TRUE(ran);
    EXPECT_EQ(worker.pending_bytes(), 0);
}

TEST(AdamW8bit, TheDynamicMapsAreBitsandbytesAndQuantizingIsNearest) {
    const at::Tensor signed_map = sf::train::dynamic_map(true);
    const at::Tensor unsigned_map = sf::train::dynamic_map(false);
    for (const at::Tensor& m : {signed_map, unsigned_map}) {
        ASSERT_EQ(m.numel(), 256);
        EXPECT_TRUE(torch::equal(std::get<0>(m.sort()), m)) << "sorted";
        EXPECT_EQ(m.max().item<float>(), 1.0f);
    }
    // bitsandbytes' create_dynamic_map(signed=True): -0.99297, 0, 1e-6 * 0.55 at the small end.
    EXPECT_NEAR(signed_map[0].item<float>(), -0.992969f, 1e-5);
    EXPECT_NEAR(signed_map[1].item<float>(), -0.978906f, 1e-5);
    EXPECT_EQ((signed_map == 0).sum().item<int64_t>(), 1);
    EXPECT_NEAR(signed_map[128].item<float>(), 5.5e-7f, 1e-9);
    EXPECT_EQ(unsigned_map.min().item<float>(), 0.0f);
    EXPECT_NEAR(unsigned_map[1].item<float>(), 3.25e-7f, 1e-9);
    // Blocks of 2048 with their own absmax: a tiny block keeps its precision beside a large one.
    torch::manual_seed(5);
    at::Tensor x = torch::randn({5000});
    x.slice(0, 2048, 4096).mul_(1e-4);
    const auto q = sf::train::BlockQuantized::quantize(x, true);
    EXPECT_EQ(q.codes.scalar_type(), at::kByte);
    EXPECT_EQ(q.absmax.numel(), 3);
    const at::Tensor back = q.dequantize(x);
    const at::Tensor err = (back - x).abs() / x.abs().clamp_min(1e-12);
    EXPECT_LT(err.median().item<float>(), 0.05) << "the nearest of 256 dynamic values";
    const at::Tensor small = back.slice(0, 2048, 4096), small_x = x.slice(0, 2048, 4096);
    EXPECT_LT(((small - small_x).norm() / small_x.norm()).item<float>(), 0.05);
    EXPECT_TRUE(torch::equal(sf::train::BlockQuantized::quantize(torch::zeros({10}), false)
                                 .dequantize(torch::zeros({10})),
                             torch::zeros({10})));
}

// A TrainStep of the tiny model with fp32 or 8-bit AdamW at learning rate 1e-3.
std::unique_ptr<sf::train::TrainStep> adamw_step(bool eight_bit, SanaTransformer model) {
    sf::train::AdamWOptions a;
    a.lr = 1e-3;
    a.eight_bit = eight_bit;
    return std::make_unique<sf::train::TrainStep>(
        model.ptr(), named(*model), a, sf::train::LRSchedule("constant", 1e-3, 0, 1000),
        sf::train::TrainStepOptions{}, c10::Device(c10::kCPU));
}

// 100 steps of the tiny model: 8-bit moments stay close to fp32 AdamW (within 3% of how far the
// weights moved) and take a quarter of its state's bytes.
TEST(AdamW8bit, TracksFp32AdamWOver100StepsInAQuarterOfTheState) {
    const sf::train::MicroBatch batch = sample_batch(2);
    auto fp32 = adamw_step(false, seeded_model()), q8 = adamw_step(true, seeded_model());
    std::map<std::string, at::Tensor> start;
    for (const auto& [name, p] : named(fp32->model().module())) start[name] = p.detach().clone();
    at::Generator g1 = at::detail::createCPUGenerator(1), g2 = at::detail::createCPUGenerator(1);
    double worst_loss = 0;  // |loss8 - loss32| / loss32, the same noise drawn for both
    for (int i = 0; i < 100; ++i) {
        const double l32 = fp32->step([&](int64_t) { return batch; }, g1).loss;
        const double l8 = q8->step([&](int64_t) { return batch; }, g2).loss;
        worst_loss = std::max(worst_loss, std::abs(l8 - l32) / l32);
    }
    double moved = 0, apart = 0;
    const auto p32 = named(fp32->model().module()), p8 = named(q8->model().module());
    for (size_t i = 0; i < p32.size(); ++i) {
        moved += (p32[i].second - start.at(p32[i].first)).pow(2).sum().item<double>();
        apart += (p8[i].second - p32[i].second).pow(2).sum().item<double>();
    }
    std::printf(
        "[ adamw8  ] 100 steps: losses at most %.5f apart (relative), weights "
        "|w8 - w32| / |w32 - w0| = %.4f\n",
        worst_loss, std::sqrt(apart / moved));
    EXPECT_LT(worst_loss, 0.01);               // measured 0.0013
    EXPECT_LT(std::sqrt(apart / moved), 0.2);  // measured 0.094

    // The state of every tensor of kMin8BitSize or more: a byte per value and a float per block
    // for each moment, about a quarter of fp32's; smaller ones stay fp32.
    const auto state32 = fp32->optimizer().state(), state8 = q8->optimizer().state();
    for (const auto& [name, p] : p8) {
        const int64_t fp32_bytes = state32.at(name + ".exp_avg").nbytes() * 2;
        if (p.numel() < sf::train::kMin8BitSize) {
            EXPECT_TRUE(state8.count(name + ".exp_avg")) << name;
            continue;
        }
        const int64_t bytes = state8.at(name + ".exp_avg.codes").nbytes() +
                              state8.at(name + ".exp_avg.absmax").nbytes() +
                              state8.at(name + ".exp_avg_sq.codes").nbytes() +
                              state8.at(name + ".exp_avg_sq.absmax").nbytes();
        EXPECT_LE(bytes * 100, fp32_bytes * 26) << name;
    }
}

// A state saved after step 2 and loaded into a fresh 8-bit optimizer (with the weights and the
// generator of then) makes step 3 exactly as the uninterrupted run made it; an fp32 state is
// refused naming what it is.
TEST(AdamW8bit, AStateSavedMidRunResumesToTheRunsNextStep) {
    const sf::train::MicroBatch batch = sample_batch(2);
    auto run = adamw_step(true, seeded_model());
    at::Generator gen = at::detail::createCPUGenerator(1);
    std::map<std::string, at::Tensor> saved_state, saved_weights;
    at::Tensor saved_gen;
    for (int i = 0; i < 3; ++i) {
        if (i == 2) {
            // Copies: state() hands out the live moments, which the next step updates in place.
            for (const auto& [name, t] : run->optimizer().state()) saved_state[name] = t.clone();
            saved_gen = gen.get_state();
            for (const auto& [name, p] : named(run->model().module()))
                saved_weights[name] = p.detach().clone();
        }
        run->step([&](int64_t) { return batch; }, gen);
    }
    auto resumed = adamw_step(true, seeded_model());
    for (const auto& [name, p] : named(resumed->model().module())) {
        torch::NoGradGuard no_grad;
        p.copy_(saved_weights.at(name));
    }
    resumed->optimizer().load_state(saved_state);
    resumed->set_steps_done(2);
    at::Generator again = at::detail::createCPUGenerator(1);
    again.set_state(saved_gen);
    resumed->step([&](int64_t) { return batch; }, again);
    const auto a = named(resumed->model().module()), b = named(run->model().module());
    for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    // A fp32 state is refused by the 8-bit optimizer, naming the parameter.
    auto fp32 = adamw_step(false, seeded_model());
    fp32->step([&](int64_t) { return batch; }, gen);
    try {
        resumed->optimizer().load_state(fp32->optimizer().state());
        ADD_FAILURE() << "fp32 moments loaded as 8-bit";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("not 8-bit"), std::string::npos) << e.what();
    }
}

TEST(TrainStep, AccumulatedMicroBatchesGiveTheGradientsOfOneBatch) {
    sf::train::TrainStepOptions whole_o, micro_o;
    whole_o.keep_gradients = micro_o.keep_gradients = true;
    micro_o.accumulation = 2;
    auto whole = make_step(seeded_model(), whole_o, 0.0);
    auto micro = make_step(seeded_model(), micro_o, 0.0);
    const sf::train::MicroBatch batch = sample_batch(2);
    at::Generator g1 = at::detail::createCPUGenerator(1), g2 = at::detail::createCPUGenerator(1);
    const auto r1 = whole.step([&](int64_t) { return batch; }, g1);
    const auto r2 = micro.step([&](int64_t k) { return slice(batch, k); }, g2);
    EXPECT_NEAR(r1.loss, r2.loss, 1e-5 * std::abs(r1.loss));
    const auto p1 = named(whole.model().module()), p2 = named(micro.model().module());
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) {
        ASSERT_TRUE(p1[i].second.grad().defined()) << p1[i].first;
        EXPECT_TRUE(torch::allclose(p1[i].second.grad(), p2[i].second.grad(), 1e-4, 1e-6))
            << p1[i].first;
    }
}

// A micro-batch split into passes: the same loss and gradients as the whole micro-batch (the
// samples and noise are drawn for the whole), with unequal parts (3 samples in 2 passes) and one
// sample per pass, with less memory in the forward.
TEST(TrainStep, ASplitMicroBatchGivesTheGradientsOfTheWholeWithLessMemory) {
    const sf::train::MicroBatch batch = sample_batch(3);
    auto run = [&](int64_t split) {
        sf::train::TrainStepOptions o;
        o.keep_gradients = true;
        o.micro_batch_split = split;
        auto step = make_step(seeded_model(), o, 0.0);
        at::Generator gen = at::detail::createCPUGenerator(1);
        const auto r = step.step([&](int64_t) { return batch; }, gen);
        std::map<std::string, at::Tensor> grads;
        for (const auto& [name, p] : named(step.model().module())) grads[name] = p.grad().clone();
        return std::make_tuple(r.loss, grads, step.phase_peaks().at("forward").tensor_bytes);
    };
    const auto [loss, grads, forward_peak] = run(1);
    for (const int64_t split : {2, 3, 8}) {  // 8 > 3 samples: one sample per pass
        SCOPED_TRACE("split " + std::to_string(split));
        const auto [split_loss, split_grads, split_peak] = run(split);
        EXPECT_NEAR(split_loss, loss, 1e-6 * std::abs(loss));
        for (const auto& [name, g] : grads)
            EXPECT_TRUE(torch::allclose(split_grads.at(name), g, 1e-5, 1e-7)) << name;
        if (split == 3) {
            EXPECT_LT(split_peak, forward_peak) << "the passes kept every sample";
        }
    }
    sf::train::TrainStepOptions bad;
    bad.micro_batch_split = 0;
    EXPECT_THROW(make_step(seeded_model(), bad), sf::Error);
}

// Prior preservation's per-sample loss weights go with their samples into every part of a split
// micro-batch: the loss and gradients do not depend on the split, and weights of 1 are no weights.
TEST(TrainStep, SampleWeightsStayWithTheirSamplesInEveryPart) {
    sf::train::MicroBatch batch = sample_batch(4);
    auto run = [&](const at::Tensor& weights, int64_t split) {
        sf::train::TrainStepOptions o;
        o.keep_gradients = true;
        o.micro_batch_split = split;
        auto step = make_step(seeded_model(), o, 0.0);
        at::Generator gen = at::detail::createCPUGenerator(1);
        sf::train::MicroBatch mb = batch;
        mb.sample_weights = weights;
        const auto r = step.step([&](int64_t) { return mb; }, gen);
        std::map<std::string, at::Tensor> grads;
        for (const auto& [name, p] : named(step.model().module())) grads[name] = p.grad().clone();
        return std::make_pair(r.loss, grads);
    };
    const at::Tensor weights = torch::tensor({2.0f, 2.0f, 0.5f, 0.5f});
    const auto [loss, grads] = run(weights, 1);
    for (const int64_t split : {2, 4}) {
        SCOPED_TRACE("split " + std::to_string(split));
        const auto [split_loss, split_grads] = run(weights, split);
        EXPECT_NEAR(split_loss, loss, 1e-6 * std::abs(loss));
        for (const auto& [name, g] : grads)
            EXPECT_TRUE(torch::allclose(split_grads.at(name), g, 1e-5, 1e-7)) << name;
    }
    const auto [plain, plain_grads] = run(at::Tensor(), 1);
    const auto [ones, ones_grads] = run(torch::ones({4}), 1);
    EXPECT_EQ(ones, plain);
    EXPECT_NE(loss, plain) << "the weights were not applied";
}

// --auto_fit's order: split the micro-batch down to one sample per pass, then checkpointing,
// chunked attention, the chunked feed-forward, then nothing.
TEST(AutoFit, RelievesCheapestFirstUntilNothingIsLeft) {
    sf::train::TrainStepOptions o;
    std::vector<std::string> changes;
    while (auto change = sf::train::relieve(o, 5, /*video=*/false)) changes.push_back(*change);
    ASSERT_EQ(changes.size(), 6u);
    EXPECT_NE(changes[0].find("--micro_batch_split 2"), std::string::npos) << changes[0];
    EXPECT_NE(changes[2].find("--micro_batch_split 8"), std::string::npos) << changes[2];
    EXPECT_NE(changes[3].find("--gradient_checkpointing"), std::string::npos) << changes[3];
    EXPECT_NE(changes[4].find("--attention chunked"), std::string::npos) << changes[4];
    EXPECT_NE(changes[5].find("--ff_chunk_size 8"), std::string::npos) << changes[5];
    EXPECT_EQ(o.micro_batch_split, 8);
    EXPECT_EQ(o.gradient_checkpointing, 1);
    EXPECT_EQ(o.attention, "chunked");
    EXPECT_EQ(o.ff_chunk_size, 8);
    sf::train::TrainStepOptions video;
    video.micro_batch_split = 1;
    video.gradient_checkpointing = 1;
    video.attention = "fused";
    ASSERT_TRUE(sf::train::relieve(video, 1, /*video=*/true));
    EXPECT_EQ(video.ff_chunk_size, 1) << "a video's feed-forward a frame at a time";
}

// A step that ran out of memory before AdamW began may be run again; once the fused pass has
// updated a parameter it may not (the retry would update it twice).
TEST(AutoFit, AStepIsRetryableOnlyWhileNoParameterWasUpdated) {
    const sf::train::MicroBatch batch = sample_batch(2);
    for (const bool fused : {false, true}) {
        SCOPED_TRACE(fused ? "fused" : "plain");
        sf::train::TrainStepOptions o;
        o.fused_backward = fused;
        auto step = make_step(seeded_model(), o);
        at::Generator gen = at::detail::createCPUGenerator(1);
        // Out of memory in the forward: nothing changed.
        EXPECT_THROW(step.step(
                         [&](int64_t) {
                             sf::mem::set_cpu_budget(sf::mem::cpu_stats().current + (256 << 10));
                             return batch;
                         },
                         gen),
                     sf::Error);
        sf::mem::set_cpu_budget(0);
        EXPECT_TRUE(step.retryable());
        sf::train::TrainStepOptions adapted = step.options();
        adapted.micro_batch_split = 2;
        step.adapt(adapted);
        EXPECT_EQ(step.options().micro_batch_split, 2);
        EXPECT_NO_THROW(step.step([&](int64_t) { return batch; }, gen));
    }
}

// Sets a byte budget just above what is live when the fused pass reduces its second parameter:
// the first is updated by then, and the second's AdamW state does not fit.
class BudgetAtSecondReduce final : public sf::train::GradientSync {
public:
    void reduce_one(size_t, const at::Tensor&) override {
        if (++calls == 2) sf::mem::set_cpu_budget(sf::mem::cpu_stats().current + 1024);
    }
    int calls = 0;
};

TEST(AutoFit, AStepThatUpdatedAParameterIsNotRetryable) {
    sf::train::TrainStepOptions o;
    o.fused_backward = true;
    auto model = seeded_model();
    sf::train::AdamWOptions a;
    auto sync = std::make_shared<BudgetAtSecondReduce>();
    sf::train::TrainStep step(model.ptr(), named(*model), a,
                              sf::train::LRSchedule("constant", 1e-3, 0, 100), o,
                              c10::Device(c10::kCPU), sync);
    at::Generator gen = at::detail::createCPUGenerator(1);
    const sf::train::MicroBatch batch = sample_batch(2);
    try {
        step.step([&](int64_t) { return batch; }, gen);
        ADD_FAILURE() << "the step fit";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kOutOfMemory) << e.what();
    }
    sf::mem::set_cpu_budget(0);
    EXPECT_GE(sync->calls, 2);
    EXPECT_FALSE(step.retryable()) << "a retry would update the first parameter twice";
}

// Checkpointing, chunked self-attention and the chunked feed-forward (rows of 2 of 8, so four
// recomputed pieces of each block), alone and together.
std::vector<std::pair<std::string, sf::train::TrainStepOptions>> recomputing_remedies() {
    std::vector<std::pair<std::string, sf::train::TrainStepOptions>> out;
    sf::train::TrainStepOptions o;
    out.emplace_back("none", o);
    o.gradient_checkpointing = 1;
    out.emplace_back("checkpointing", o);
    o = {};
    o.attention = "chunked";
    o.attention_chunk = 16;
    out.emplace_back("chunked attention", o);
    o = {};
    o.ff_chunk_size = 2;
    out.emplace_back("chunked feed-forward", o);
    o.attention = "chunked";
    o.attention_chunk = 16;
    o.gradient_checkpointing = 1;
    out.emplace_back("all three", o);
    return out;
}

// One step of `o` on the seeded model, its sync counting when each gradient is reported
// complete; the model (its gradients kept) and the counts.
std::pair<SanaTransformer, std::vector<int>> counted_step(sf::train::TrainStepOptions o) {
    o.keep_gradients = true;
    auto model = seeded_model();
    auto sync = std::make_shared<sf::test::CountingSync>();
    sf::train::TrainStep step(model.ptr(), named(*model), {},
                              sf::train::LRSchedule("constant", 1e-3, 0, 100), o,
                              c10::Device(c10::kCPU), sync);
    at::Generator gen = at::detail::createCPUGenerator(1);
    const sf::train::MicroBatch batch = sample_batch(2);
    step.step([&](int64_t) { return batch; }, gen);
    return {model, sync->counts};
}

// The fused pass updates and the data-parallel sync sends a gradient when its accumulator runs,
// so that must happen once per backward pass: recomputed pieces of a block must hand their
// parameters' gradients over together, not each piece's share as it comes.
TEST(TrainStep, EachGradientIsCompleteOnceInABackwardPassWithEveryRemedy) {
    for (const auto& [what, o] : recomputing_remedies()) {
        auto [model, counts] = counted_step(o);
        const auto params = named(*model);
        ASSERT_EQ(counts.size(), params.size()) << what;
        for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_EQ(counts[i], params[i].second.grad().defined() ? 1 : 0)
                << what << ": " << params[i].first;
        }
    }
}

// With block swap the sync is not called from inside the backward: a swapped block's gradients
// reach the host parameters only when its lend ends, so they are reduced after the backward.
TEST(TrainStep, BlockSwapLeavesTheReductionAfterTheBackward) {
    sf::train::TrainStepOptions o;
    o.blocks_to_swap = 1;
    EXPECT_TRUE(counted_step(o).second.empty()) << "begin_backward was called";
}

TEST(TrainStep, FusedBackwardPassUpdatesLikeTheOptimizerStep) {
    for (const auto& [what, plain_o] : recomputing_remedies()) {
        sf::train::TrainStepOptions fused_o = plain_o;
        fused_o.fused_backward = true;
        auto plain = make_step(seeded_model(), plain_o);
        auto fused = make_step(seeded_model(), fused_o);
        const sf::train::MicroBatch batch = sample_batch(2);
        at::Generator g1 = at::detail::createCPUGenerator(1),
                      g2 = at::detail::createCPUGenerator(1);
        for (int i = 0; i < 3; ++i) {
            plain.step([&](int64_t) { return batch; }, g1);
            fused.step([&](int64_t) { return batch; }, g2);
        }
        const auto p1 = named(plain.model().module()), p2 = named(fused.model().module());
        for (size_t i = 0; i < p1.size(); ++i) {
            EXPECT_TRUE(torch::equal(p1[i].second, p2[i].second)) << what << ": " << p1[i].first;
            EXPECT_FALSE(p2[i].second.grad().defined())
                << "the fused pass keeps no gradient: " << p2[i].first;
        }
    }
}

TEST(TrainStep, FusedBackwardPassNeverHoldsAllGradients) {
    // A model whose weights outweigh its activations (wide, small latents): there the gradients
    // are most of the backward's memory.
    SanaTransformerConfig c = small_config();
    c.num_attention_heads = 8;
    c.attention_head_dim = 32;
    c.cross_attention_dim = 256;
    c.num_cross_attention_heads = 4;
    c.cross_attention_head_dim = 64;
    c.num_layers = 3;
    torch::manual_seed(1);
    auto plain = make_step(SanaTransformer(c), {});
    torch::manual_seed(1);
    sf::train::TrainStepOptions fo;
    fo.fused_backward = true;
    auto fused = make_step(SanaTransformer(c), fo);
    int64_t param_bytes = 0;
    for (auto& p : plain.model().module().parameters()) param_bytes += p.numel() * 4;
    sf::train::MicroBatch b = sample_batch(1);
    b.latents = b.latents.slice(2, 0, 2).slice(3, 0, 2).contiguous();
    at::Generator g1 = at::detail::createCPUGenerator(1), g2 = at::detail::createCPUGenerator(1);
    for (int i = 0; i < 2; ++i) {  // the second step has the optimizer state already
        plain.step([&](int64_t) { return b; }, g1);
        fused.step([&](int64_t) { return b; }, g2);
    }
    auto peak = [](const sf::train::TrainStep& s) {
        return std::max(s.phase_peaks().at("backward").tensor_bytes,
                        s.phase_peaks().at("optimizer").tensor_bytes);
    };
    // The plain step holds weights, two moments and a full set of gradients at once; the fused one
    // never more than the weights, the moments and a few gradients.
    EXPECT_LT(peak(fused), peak(plain) - param_bytes / 2) << "params " << param_bytes;
}

TEST(TrainStep, LossScalerSkipsAStepWithAnInfiniteGradient) {
    sf::train::TrainStepOptions o;
    o.loss_scaling = true;
    auto step = make_step(seeded_model(), o);
    auto params = named(step.model().module());
    std::vector<at::Tensor> before;
    for (auto& [n, p] : params) before.push_back(p.detach().clone());
    // One gradient turns infinite in this step's backward.
    bool inject = true;
    auto handle = params.front().second.register_hook([&](at::Tensor g) {
        return inject ? torch::full_like(g, std::numeric_limits<float>::infinity()) : g;
    });
    at::Generator gen = at::detail::createCPUGenerator(1);
    const sf::train::MicroBatch batch = sample_batch(2);
    const double scale = step.scaler().scale();
    auto r = step.step([&](int64_t) { return batch; }, gen);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(step.scaler().scale(), scale / 2);
    for (size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::equal(params[i].second, before[i])) << params[i].first;
    inject = false;
    r = step.step([&](int64_t) { return batch; }, gen);
    EXPECT_FALSE(r.skipped);
    EXPECT_FALSE(torch::equal(params.back().second, before.back()));
    params.front().second.remove_hook(handle);
}

TEST(TrainStep, RefusesFusedBackwardWithGlobalClippingOrLossScaling) {
    sf::train::TrainStepOptions o;
    o.fused_backward = true;
    o.max_grad_norm = 1.0;
    try {
        make_step(seeded_model(), o);
        FAIL();
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("--max_grad_norm"), std::string::npos) << e.what();
    }
    o.max_grad_norm = 0;
    o.loss_scaling = true;
    EXPECT_THROW(make_step(seeded_model(), o), sf::Error);
}

TEST(TrainStep, OutOfMemoryNamesThePhaseAndTheFlags) {
    auto step = make_step(seeded_model(), {});
    at::Generator gen = at::detail::createCPUGenerator(1);
    sf::train::MicroBatch batch = sample_batch(2);
    try {
        // Set once the batch is loaded: room for the noise, far less than a forward needs.
        step.step(
            [&](int64_t) {
                sf::mem::set_cpu_budget(sf::mem::cpu_stats().current + (256 << 10));
                return batch;
            },
            gen);
        sf::mem::set_cpu_budget(0);
        FAIL() << "the step fit in 256 KiB";
    } catch (const sf::Error& e) {
        sf::mem::set_cpu_budget(0);
        EXPECT_EQ(e.code(), sf::ErrorCode::kOutOfMemory);
        const std::string m = e.what();
        EXPECT_NE(m.find("forward phase"), std::string::npos) << m;
        EXPECT_NE(m.find("--gradient_checkpointing"), std::string::npos) << m;
    }
    // Nothing of the failed step is left, and the next step runs.
    for (auto& p : step.model().module().parameters()) EXPECT_FALSE(p.grad().defined());
    EXPECT_NO_THROW(step.step([&](int64_t) { return batch; }, gen));
}

// A reduction that zeroes every gradient it sees (and counts the calls): if it runs where the
// data-parallel reduce must, between the last backward and the update, AdamW sees zero gradients
// and a step only decays the weights.
class ZeroingSync final : public sf::train::GradientSync {
public:
    void reduce_all(const std::vector<at::Tensor>& params) override {
        ++all_calls;
        for (const auto& p : params) p.grad().zero_();
    }
    void reduce_one(size_t index, const at::Tensor& param) override {
        ++one_calls[index];
        param.grad().zero_();
    }
    int all_calls = 0;
    std::map<size_t, int> one_calls;
};

TEST(TrainStep, GradientsAreReducedOncePerStepBeforeTheUpdate) {
    for (bool fused : {false, true}) {
        SCOPED_TRACE(fused ? "fused backward pass" : "optimizer step");
        sf::train::TrainStepOptions o;
        o.accumulation = 2;
        o.fused_backward = fused;
        SanaTransformer model = seeded_model();
        const auto params = named(*model);
        std::vector<at::Tensor> before;
        for (const auto& [name, p] : params) before.push_back(p.detach().clone());
        auto sync = std::make_shared<ZeroingSync>();
        sf::train::AdamWOptions a;
        a.lr = 1e-2;
        sf::train::TrainStep step(model.ptr(), params, a,
                                  sf::train::LRSchedule("constant", a.lr, 0, 100), o,
                                  c10::Device(c10::kCPU), sync);
        const sf::train::MicroBatch batch = sample_batch(2);
        at::Generator gen = at::detail::createCPUGenerator(1);
        for (int i = 0; i < 2; ++i) step.step([&](int64_t k) { return slice(batch, k); }, gen);

        if (fused) {
            EXPECT_EQ(sync->all_calls, 0);
            ASSERT_EQ(sync->one_calls.size(), params.size());  // every parameter ...
            for (const auto& [index, calls] : sync->one_calls)
                EXPECT_EQ(calls, 2) << index;  // once a step
        } else {
            EXPECT_EQ(sync->all_calls, 2);  // once a step, not once a micro-batch
            EXPECT_TRUE(sync->one_calls.empty());
        }
        // Zero gradients reached the update: two steps of decay alone, w * (1 - lr * wd)^2.
        const double decay = (1 - a.lr * a.weight_decay) * (1 - a.lr * a.weight_decay);
        for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_TRUE(torch::allclose(params[i].second, before[i] * decay, 1e-6, 1e-7))
                << params[i].first;
        }
    }
    // Without the reduction the same steps move the weights (the check above can fail).
    SanaTransformer model = seeded_model();
    const auto params = named(*model);
    const at::Tensor first = params.front().second.detach().clone();
    auto step = make_step(model, {}, 1e-2);
    at::Generator gen = at::detail::createCPUGenerator(1);
    step.step([&](int64_t) { return sample_batch(2); }, gen);
    EXPECT_FALSE(torch::allclose(params.front().second, first * (1 - 1e-2 * 1e-2), 1e-6, 1e-7));
}

TEST(TrainStep, LatentsOfAnotherRankAreRefusedNamingTheModel) {
    auto step = make_step(seeded_model(), {});
    at::Generator gen = at::detail::createCPUGenerator(1);
    sf::train::MicroBatch video = sample_batch(2);
    video.latents = video.latents.unsqueeze(2);  // [B, C, 1, h, w]
    const std::string m =
        sf::test::error_of([&] { step.step([&](int64_t) { return video; }, gen); });
    EXPECT_NE(m.find("SanaTransformer2DModel takes latents of rank 4"), std::string::npos) << m;
}

}  // namespace
