// Validation sampling: the Euler sigmas are diffusers' FlowMatchEulerDiscreteScheduler's, the
// DPM-Solver++'s schedule and steps its DPMSolverMultistepScheduler's, UniPC's steps its
// UniPCMultistepScheduler's; each integrates a flow exactly where it is exact; guidance combines
// the transformer's two velocities as Sana's pipeline does, batched or not; a model root's
// scheduler config is read or refused by key.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "model/sana/sana_transformer.h"
#include "stages/sample/dpm_solver.h"
#include "stages/sample/flow_sampler.h"
#include "stages/sample/scheduler_config.h"
#include "stages/sample/unipc.h"

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

// What diffusers 0.36's DPMSolverMultistepScheduler(prediction_type="flow_prediction",
// use_flow_sigmas=True, flow_shift=s).set_timesteps(n) puts in .sigmas and .timesteps (printed by
// the project's .venv). The timesteps are truncated, not rounded: 1 - 0.667 is 332.99999 x 1000.
TEST(DpmSolver, SigmasAndTimestepsAreDPMSolverMultistepSchedulers) {
    struct Case {
        double shift;
        int64_t steps;
        std::vector<double> sigmas;
        std::vector<int64_t> timesteps;
    };
    const Case cases[] = {
        {3.0,
         4,
         {0.9996664524078369, 0.8996397852897644, 0.7496247887611389, 0.4996665418148041, 0.0},
         {999, 899, 749, 499}},
        {1.0,
         3,
         {0.9990000128746033, 0.6660000085830688, 0.3330000042915344, 0.0},
         {999, 666, 332}},
        {2.5, 1, {0.9995997548103333, 0.0}, {999}},
    };
    for (const Case& c : cases) {
        const auto ours = sf::sample::flow_schedule(c.steps, c.shift);
        EXPECT_EQ(ours.timesteps, c.timesteps) << "shift " << c.shift;
        ASSERT_EQ(ours.sigmas.size(), c.sigmas.size()) << c.shift;
        for (size_t i = 0; i < ours.sigmas.size(); ++i)  // float32 both
            EXPECT_EQ(ours.sigmas[i], c.sigmas[i]) << "shift " << c.shift << " sigma " << i;
    }
    EXPECT_THROW(sf::sample::flow_schedule(0, 3.0), sf::Error);
    EXPECT_THROW(sf::sample::flow_schedule(4, 0.0), sf::Error);
}

// The flow v(x, t) = sin(3x) t / 1000 + x / 2 from x = (-1.5, -0.5, 0.25, 1, 2), which
// upstream's schedulers were stepped on as Sana's pipeline steps them (the model given the int64
// timestep), their results printed by the project's .venv in float32: `sample` run on it must end
// within 2e-6 of `upstream`.
void expect_upstreams_end(
    const std::function<at::Tensor(const sf::sample::Velocity&, const at::Tensor&)>& sample,
    const std::vector<double>& upstream, const std::string& what) {
    const sf::sample::Velocity v = [](const at::Tensor& x, const at::Tensor& t) {
        return torch::sin(3 * x) * (t.unsqueeze(1) / 1000) + 0.5 * x;
    };
    const at::Tensor x = sample(v, torch::tensor({-1.5, -0.5, 0.25, 1.0, 2.0}).unsqueeze(0));
    const at::Tensor expected = torch::tensor(upstream, torch::kFloat).unsqueeze(0);
    EXPECT_TRUE(torch::allclose(x, expected, 0, 2e-6))
        << what << ": " << (x - expected).abs().max().item<double>();
}

// What diffusers 0.36's DPMSolverMultistepScheduler (flow_prediction, use_flow_sigmas) makes of
// expect_upstreams_end's flow. The variants differ from one another by 3e-3 or more.
TEST(DpmSolver, StepsAsDPMSolverMultistepSchedulerDoesInEveryOrder) {
    struct Case {
        int64_t steps;
        double shift;
        int order;
        bool heun;
        std::vector<double> upstream;
    };
    const Case cases[] = {
        {6,
         3.0,
         1,
         false,
         {-1.3510841131210327, -0.02880684658885002, 0.011477649211883545, 0.2549579441547394,
          1.5077197551727295}},
        {6,
         3.0,
         2,
         false,
         {-1.3185176849365234, -0.051777034997940063, 0.02309698984026909, 0.24627001583576202,
          1.5127363204956055}},
        {6,
         3.0,
         2,
         true,
         {-1.3135809898376465, -0.05512990802526474, 0.024759721010923386, 0.24507136642932892,
          1.5134308338165283}},
        {3,
         1.0,
         1,
         false,
         {-1.3892438411712646, -0.00747349439188838, -0.0015545481583103538, 0.30591773986816406,
          1.4856919050216675}},
        {3,
         1.0,
         2,
         false,
         {-1.3779321908950806, -0.026833534240722656, 0.014312220737338066, 0.29929929971694946,
          1.4968056678771973}},
        {3,
         1.0,
         2,
         true,
         {-1.3753787279129028, -0.031191322952508926, 0.017870597541332245, 0.2978276014328003,
          1.499263048171997}},
    };
    for (const Case& c : cases) {
        expect_upstreams_end(
            [&](const sf::sample::Velocity& v, const at::Tensor& start) {
                return sf::sample::dpm_solver_sample(
                    v, start, sf::sample::flow_schedule(c.steps, c.shift), {c.order, c.heun});
            },
            c.upstream,
            fmt::format("{} steps, shift {}, order {}, heun {}", c.steps, c.shift, c.order,
                        c.heun));
    }
}

// What diffusers 0.36's UniPCMultistepScheduler (flow_prediction, use_flow_sigmas; predict_x0,
// bh2, lower_order_final) makes of the same flow from the same start, stepped as Sana's pipeline
// steps it: orders 1 to 3, and the corrector disabled after steps 0 and 2. Orders 2 and 3 are
// equal in 3 steps (the order falls to the steps left); elsewhere the variants differ by 1e-3 or
// more.
TEST(UniPc, StepsAsUniPCMultistepSchedulerDoesInEveryOrder) {
    struct Case {
        int64_t steps;
        double shift;
        int order;
        std::vector<int64_t> disable_corrector;
        std::vector<double> upstream;
    };
    const Case cases[] = {
        {6,
         3.0,
         1,
         {},
         {-1.3387075662612915, -0.036728061735630035, 0.01588970609009266, 0.24736759066581726,
          1.510750412940979}},
        {6,
         3.0,
         2,
         {},
         {-1.3112140893936157, -0.054347582161426544, 0.024462822824716568, 0.24314381182193756,
          1.513405203819275}},
        {6,
         3.0,
         3,
         {},
         {-1.30897855758667, -0.05419893562793732, 0.024547699838876724, 0.24175488948822021,
          1.5135502815246582}},
        {3,
         1.0,
         1,
         {},
         {-1.3722560405731201, -0.03652026876807213, 0.022214092314243317, 0.29603874683380127,
          1.5022433996200562}},
        {3,
         1.0,
         3,
         {},
         {-1.3606990575790405, -0.05629182979464531, 0.03824236989021301, 0.2895203232765198,
          1.5130406618118286}},
        {6,
         3.0,
         2,
         {0, 2},
         {-1.3148953914642334, -0.05300553888082504, 0.02374735102057457, 0.2463194876909256,
          1.512673258781433}},
    };
    for (const Case& c : cases) {
        expect_upstreams_end(
            [&](const sf::sample::Velocity& v, const at::Tensor& start) {
                return sf::sample::unipc_sample(v, start,
                                                sf::sample::flow_schedule(c.steps, c.shift),
                                                {c.order, c.disable_corrector});
            },
            c.upstream,
            fmt::format("{} steps, shift {}, order {}, {} corrections disabled", c.steps, c.shift,
                        c.order, c.disable_corrector.size()));
    }
}

// On a straight path the data prediction is the same at every step, so DPM-Solver++ and UniPC of
// every order land on x0 (each difference term is 0), as Euler does.
TEST(DpmSolver, FollowsAStraightFlowToItsEndAsUniPcDoes) {
    torch::manual_seed(5);
    const at::Tensor x0 = torch::randn({2, 4, 3, 3});
    const at::Tensor noise = torch::randn({2, 4, 3, 3});
    const auto schedule = sf::sample::flow_schedule(7, 3.0);
    const at::Tensor start = x0 + schedule.sigmas[0] * (noise - x0);
    for (int solver = 0; solver < 4; ++solver) {
        int64_t calls = 0;
        size_t step = 0;
        const sf::sample::Velocity v = [&](const at::Tensor& x, const at::Tensor& t) {
            ++calls;
            EXPECT_EQ(t[1].item<double>(), static_cast<double>(schedule.timesteps.at(step)));
            return (x - x0) / schedule.sigmas.at(step++);
        };
        const at::Tensor x = solver == 0
                                 ? sf::sample::dpm_solver_sample(v, start, schedule, {})
                                 : sf::sample::unipc_sample(v, start, schedule, {solver, {}});
        EXPECT_EQ(calls, 7) << solver;
        EXPECT_TRUE(torch::allclose(x, x0, 1e-4, 1e-5))
            << "solver " << solver << ": " << (x - x0).abs().max().item<double>();
    }
}

// A model root's scheduler config: Sana's own (DPM-Solver++ 2M, flow_shift 3) and an Euler one
// read as upstream reads them; a setting sanaflow would sample otherwise is refused naming the
// file and key.
TEST(SchedulerConfig, ReadsSanasAndEulersAndRefusesWhatItCannotRun) {
    const auto dir = std::filesystem::temp_directory_path() / "sf_scheduler_config_test";
    std::filesystem::create_directories(dir);
    const auto write = [&](const std::string& text) {
        const auto path = dir / "scheduler_config.json";
        std::ofstream(path) << text;
        return path.string();
    };
    // Sana_1600M_1024px_diffusers' scheduler_config.json, its sampling keys.
    const std::string sana =
        R"({"_class_name": "DPMSolverMultistepScheduler", "algorithm_type": "dpmsolver++",
            "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": true,
            "num_train_timesteps": 1000, "prediction_type": "flow_prediction",
            "solver_order": 2, "solver_type": "midpoint", "thresholding": false,
            "use_flow_sigmas": true, "use_karras_sigmas": false, "variance_type": null})";
    auto spec = sf::sample::read_scheduler_config(write(sana));
    EXPECT_EQ(spec.kind, sf::sample::SamplerSpec::Kind::kDpmSolver);
    EXPECT_EQ(spec.shift, 3.0);
    EXPECT_EQ(spec.solver_order, 2);
    EXPECT_FALSE(spec.heun);
    EXPECT_EQ(sf::sample::describe(spec),
              "DPM-Solver++ 2M (shift 3, from " + (dir / "scheduler_config.json").string() + ")");
    spec = sf::sample::read_scheduler_config(
        write(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 2.5})"));
    EXPECT_EQ(spec.kind, sf::sample::SamplerSpec::Kind::kEuler);
    EXPECT_EQ(spec.shift, 2.5);
    const auto refused = [&](const std::string& text, const std::string& named) {
        try {
            sf::sample::read_scheduler_config(write(text));
            ADD_FAILURE() << "not refused: " << text;
        } catch (const sf::Error& e) {
            EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("scheduler_config.json"), std::string::npos);
        }
    };
    refused(R"({"_class_name": "DPMSolverMultistepScheduler"})", "use_flow_sigmas");
    std::string epsilon = sana;
    epsilon.replace(epsilon.find("flow_prediction"), 15, "epsilon");
    refused(epsilon, "prediction_type");
    std::string third = sana;
    third.replace(third.find("\"solver_order\": 2"), 17, "\"solver_order\": 3");
    refused(third, "solver_order");
    refused(R"({"_class_name": "EulerAncestralDiscreteScheduler"})",
            "EulerAncestralDiscreteScheduler");
    try {  // a value too long to print is cut short
        sf::sample::read_scheduler_config(
            write(R"({"_class_name": ")" + std::string(100000, 'x') + R"("})"));
        ADD_FAILURE() << "a long class name was not refused";
    } catch (const sf::Error& e) {
        EXPECT_LT(std::string(e.what()).size(), 500u);
    }
    // Wan's own scheduler (Wan2.1-T2V-1.3B-Diffusers' keys that matter), and its refusals.
    const std::string wan =
        R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0, "predict_x0": true,
            "prediction_type": "flow_prediction", "solver_order": 2, "solver_type": "bh2",
            "use_flow_sigmas": true, "final_sigmas_type": "zero", "lower_order_final": true,
            "disable_corrector": [], "solver_p": null})";
    spec = sf::sample::read_scheduler_config(write(wan));
    EXPECT_EQ(spec.kind, sf::sample::SamplerSpec::Kind::kUniPc);
    spec.config_file.clear();
    EXPECT_EQ(sf::sample::describe(spec), "UniPC order 2 (shift 3)");
    std::string bh1 = wan;
    bh1.replace(bh1.find("bh2"), 3, "bh1");
    refused(bh1, "solver_type");
    std::string last = wan;
    last.replace(last.find("\"lower_order_final\": true"), 25, "\"lower_order_final\": false");
    refused(last, "lower_order_final");
    refused(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": true})",
            "use_dynamic_shifting");
    refused(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": "3"})", "shift");
    std::filesystem::remove_all(dir);
}

}  // namespace
