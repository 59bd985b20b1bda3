// On a CUDA device (skipped without one): the caching allocator's statistics, a training step
// on the GPU against the same step on the CPU, the remedies lowering the CUDA peak, and the text
// encoder's sequential offload, and data-parallel gradients through NCCL. tools/gpu_check.sh
// builds and runs these on a GPU machine.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/memory.h"
#include "distributed_test_util.h"
#include "model/common/lora.h"
#include "model/gemma/gemma2.h"
#include "model/sana/sana_transformer.h"
#include "stages/distributed/data_parallel_sync.h"
#include "stages/train/train_step.h"
#include "test_util.h"

namespace {

using sf::model::SanaTransformer;
using sf::model::SanaTransformerConfig;

#define SKIP_WITHOUT_CUDA() \
    if (!sf::mem::cuda_available()) GTEST_SKIP() << "no CUDA device"

SanaTransformerConfig config() {
    SanaTransformerConfig c = SanaTransformerConfig::named("sana-tiny");
    c.caption_channels = 64;
    c.num_layers = 4;
    return c;
}

sf::train::MicroBatch batch(int64_t grid) {
    torch::manual_seed(5);
    return {torch::randn({2, 32, grid, grid}), torch::randn({2, 40, 64}),
            torch::ones({2, 40}, torch::kLong)};
}

// Peak CUDA bytes of one step with `o`, after a first step has made the optimizer state.
// The peak of two steps on cuda:0; `weights`, when given, receives the trained weights (on the
// host, in order).
int64_t cuda_step_peak(sf::train::TrainStepOptions o, int64_t grid,
                       std::vector<at::Tensor>* weights = nullptr,
                       sf::train::AdamWOptions adamw = {}) {
    torch::manual_seed(1);
    SanaTransformer model(config());
    model->to(torch::kCUDA);
    sf::train::TrainStep step(model.ptr(), sf::model::trainable_parameters(*model), adamw,
                              sf::train::LRSchedule("constant", 1e-4, 0, 10), o,
                              c10::Device(c10::kCUDA, 0));
    const auto b = batch(grid);
    at::Generator gen = at::detail::createCPUGenerator(0);
    const int64_t micro = b.latents.size(0) / o.accumulation;
    auto load = [&](int64_t k) {
        return sf::train::MicroBatch{b.latents.slice(0, k * micro, (k + 1) * micro),
                                     b.prompt_embeds.slice(0, k * micro, (k + 1) * micro),
                                     b.prompt_mask.slice(0, k * micro, (k + 1) * micro)};
    };
    step.step(load, gen);
    step.step(load, gen);
    int64_t peak = 0;
    for (const auto& [phase, p] : step.phase_peaks()) peak = std::max(peak, p.tensor_bytes);
    if (weights) {
        for (const auto& [name, w] : sf::model::trainable_parameters(*model))
            weights->push_back(w.detach().to(torch::kCPU));
    }
    return peak;
}

TEST(GpuMemory, CachingAllocatorStatsSeeTensorsAndEmptyCacheReturnsThem) {
    SKIP_WITHOUT_CUDA();
    sf::mem::reset_peak();
    const int64_t before = sf::mem::cuda_stats().current;
    {
        auto t = torch::empty({64 << 20}, torch::TensorOptions(torch::kCUDA).dtype(torch::kUInt8));
        EXPECT_GE(sf::mem::cuda_stats().current - before, 64 << 20);
    }
    EXPECT_GE(sf::mem::cuda_stats().peak - before, 64 << 20);
    EXPECT_EQ(sf::mem::cuda_stats().current, before);
    sf::mem::empty_cache();
}

TEST(GpuTrain, StepsOnTheGpuMatchTheCpu) {
    SKIP_WITHOUT_CUDA();
    // Three steps from the same weights on each device: the losses agree, and so do the weights
    // after them. AdamW's first steps move each weight by about lr whatever its gradient's size,
    // so weights are compared by how far each tensor moved: the GPU's update must be the CPU's
    // within a few percent of its length (a wrong update, or none, is off by ~100%).
    std::vector<double> losses[2];
    std::vector<at::Tensor> initial, updated[2];
    for (int i = 0; i < 2; ++i) {
        const c10::Device device = i == 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
        torch::manual_seed(1);
        SanaTransformer model(config());
        if (i == 0) {
            for (const auto& p : model->parameters()) initial.push_back(p.detach().clone());
        }
        model->to(device);
        sf::train::TrainStep step(model.ptr(), sf::model::trainable_parameters(*model), {},
                                  sf::train::LRSchedule("constant", 1e-4, 0, 10), {}, device);
        const auto b = batch(16);
        at::Generator gen = at::detail::createCPUGenerator(0);
        for (int k = 0; k < 3; ++k)
            losses[i].push_back(step.step([&](int64_t) { return b; }, gen).loss);
        for (const auto& p : model->parameters()) updated[i].push_back(p.detach().cpu());
    }
    for (int k = 0; k < 3; ++k)
        EXPECT_NEAR(losses[0][k], losses[1][k], 1e-3 * std::abs(losses[0][k])) << k;
    ASSERT_EQ(updated[0].size(), updated[1].size());
    for (size_t j = 0; j < initial.size(); ++j) {
        const double moved = (updated[0][j] - initial[j]).norm().item<double>();
        const double apart = (updated[1][j] - updated[0][j]).norm().item<double>();
        EXPECT_GT(moved, 0) << "parameter " << j << " did not move on the CPU";
        EXPECT_LT(apart, 0.05 * moved) << "parameter " << j;
    }
}

TEST(GpuTrain, RemediesLowerTheCudaPeak) {
    SKIP_WITHOUT_CUDA();
    sf::train::TrainStepOptions plain;
    const int64_t base = cuda_step_peak(plain, 64);
    sf::train::TrainStepOptions ckpt;
    ckpt.gradient_checkpointing = 1;
    EXPECT_LT(cuda_step_peak(ckpt, 64), 0.7 * base);
    sf::train::TrainStepOptions bf16;
    bf16.mixed_precision = "bf16";
    EXPECT_LT(cuda_step_peak(bf16, 64), base);
    sf::train::TrainStepOptions accum;
    accum.accumulation = 2;
    EXPECT_LT(cuda_step_peak(accum, 64), 0.8 * base);
}

// --blocks_to_swap 3 of 4 blocks: their weights, gradients and AdamW moments live in host memory,
// two blocks lent at a time (the running one, the next copied ahead on a side stream), so the
// device peak falls by about eight times a block's weights (one block's weights and gradients,
// three blocks' moments; checkpointed alike). The trained weights equal the resident run's: a
// block used before its copy ahead landed would not.
TEST(GpuTrain, BlockSwapLowersTheCudaPeakByTheSwappedBlocks) {
    SKIP_WITHOUT_CUDA();
    torch::manual_seed(1);
    SanaTransformer sizes(config());
    int64_t block_bytes = 0;
    for (const auto& p : sizes->blocks().front()->parameters())
        block_bytes += p.numel() * p.element_size();
    sf::train::TrainStepOptions ckpt;
    ckpt.gradient_checkpointing = 1;
    sf::train::TrainStepOptions swap = ckpt;
    swap.blocks_to_swap = 3;
    std::vector<at::Tensor> resident_weights, swapped_weights;
    const int64_t resident = cuda_step_peak(ckpt, 32, &resident_weights);
    const int64_t swapped = cuda_step_peak(swap, 32, &swapped_weights);
    EXPECT_LT(swapped, resident - 6 * block_bytes)
        << "resident " << resident << " swapped " << swapped << " block " << block_bytes;
    ASSERT_EQ(resident_weights.size(), swapped_weights.size());
    for (size_t i = 0; i < resident_weights.size(); ++i) {
        EXPECT_TRUE(torch::allclose(resident_weights[i], swapped_weights[i], 1e-4, 1e-6))
            << "weight " << i << " differs by "
            << (resident_weights[i] - swapped_weights[i]).abs().max().item<float>();
    }
}

// --offload_optimizer under the fused backward pass: each parameter's host update and its copy
// back run on a worker thread while the backward goes on (the CUDA copies from that thread). The
// trained weights equal the resident optimizer's, and the device keeps no moments.
TEST(GpuTrain, OffloadedUpdatesBesideTheFusedBackwardMatchTheResidentOnes) {
    SKIP_WITHOUT_CUDA();
    torch::manual_seed(1);
    SanaTransformer sizes(config());
    int64_t weight_bytes = 0;
    for (const auto& p : sizes->parameters()) weight_bytes += p.numel() * p.element_size();
    sf::train::TrainStepOptions fused;
    fused.fused_backward = true;
    sf::train::AdamWOptions offload;
    offload.offload = true;
    std::vector<at::Tensor> resident_weights, offloaded_weights;
    const int64_t resident = cuda_step_peak(fused, 32, &resident_weights);
    const int64_t offloaded = cuda_step_peak(fused, 32, &offloaded_weights, offload);
    EXPECT_LT(offloaded, resident - weight_bytes)
        << "resident " << resident << " offloaded " << offloaded << " weights " << weight_bytes;
    ASSERT_EQ(resident_weights.size(), offloaded_weights.size());
    for (size_t i = 0; i < resident_weights.size(); ++i) {
        EXPECT_TRUE(torch::allclose(resident_weights[i], offloaded_weights[i], 1e-4, 1e-6))
            << "weight " << i;
    }
}

TEST(GpuOffload, TextEncoderLayersOneAtATimeKeepTheDevicePeakBelowTheWeights) {
    SKIP_WITHOUT_CUDA();
    sf::model::Gemma2Config c = sf::model::Gemma2Config::named("gemma-2-tiny");
    c.hidden_size = 512;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 8;
    torch::manual_seed(0);
    sf::model::Gemma2Model resident(c);
    resident->eval();
    int64_t weight_bytes = 0;
    for (const auto& p : resident->parameters()) weight_bytes += p.numel() * p.element_size();
    const auto ids = torch::randint(0, c.vocab_size, {2, 32}, torch::kLong);
    torch::NoGradGuard no_grad;
    resident->set_offload(c10::Device(c10::kCUDA, 0));
    sf::mem::empty_cache();
    sf::mem::reset_peak();
    const auto offloaded = resident->forward(ids).cpu();
    const int64_t offload_peak = sf::mem::cuda_stats().peak;
    resident->set_offload(std::nullopt);
    const auto on_cpu = resident->forward(ids);
    EXPECT_TRUE(torch::allclose(offloaded, on_cpu, 1e-3, 1e-4));
    EXPECT_LT(offload_peak, weight_bytes / 2)
        << "offload peak " << offload_peak << " weights " << weight_bytes;
}

// --memory_snapshot's file: the history of two CUDA steps in torch.cuda.memory._dump_snapshot's
// pickle, with the allocator's segments and the trace of allocations pytorch.org/memory_viz
// draws.
TEST(GpuMemory, SnapshotOfTwoStepsIsAPickleWithSegmentsAndTheirTrace) {
    SKIP_WITHOUT_CUDA();
    try {
        sf::mem::require_cuda_snapshot();
    } catch (const sf::Error& e) {
        GTEST_SKIP() << e.what();
    }
    sf::mem::start_cuda_history();
    cuda_step_peak({}, 16);
    const auto path = std::filesystem::temp_directory_path() / "sf_gpu_snapshot.pickle";
    sf::mem::write_cuda_snapshot(path.string());
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(path);
    ASSERT_GT(bytes.size(), 1000u);
    EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x80) << "a pickle starts with PROTO";
    EXPECT_NE(bytes.find("segments"), std::string::npos);
    EXPECT_NE(bytes.find("device_traces"), std::string::npos);
    EXPECT_NE(bytes.find("alloc"), std::string::npos);
}

// One rank per GPU (two at most; one on a one-GPU machine), threads of this process, the buckets
// (4 KiB, so many) all-reduced by NCCL from inside the backward pass: each rank's gradients are
// those of one process with the whole batch on cuda:0.
TEST(GpuDataParallel, NcclRanksGetTheWholeBatchsGradients) {
    SKIP_WITHOUT_CUDA();
    if (!sf::distributed::nccl_built()) GTEST_SKIP() << "no NCCL in this build";
    const int ranks = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
    const auto b = batch(16);
    auto grads_of = [&](SanaTransformer model, c10::Device device,
                        std::shared_ptr<sf::train::GradientSync> sync) {
        model->to(device);
        sf::train::TrainStepOptions o;
        o.keep_gradients = true;
        sf::train::AdamWOptions a;
        a.lr = 0;
        sf::train::TrainStep step(model.ptr(), sf::model::trainable_parameters(*model), a,
                                  sf::train::LRSchedule("constant", 0, 0, 10), o, device,
                                  std::move(sync));
        at::Generator gen = at::detail::createCPUGenerator(0);
        step.step([&](int64_t) { return b; }, gen);
        std::vector<at::Tensor> grads;
        for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu());
        return grads;
    };
    auto seeded = [] {
        torch::manual_seed(1);
        return SanaTransformer(config());
    };
    const auto reference = grads_of(seeded(), c10::Device(c10::kCUDA, 0), nullptr);
    std::vector<SanaTransformer> models;
    for (int r = 0; r < ranks; ++r) models.push_back(seeded());
    const int port = sf::test::free_port();
    std::vector<std::vector<at::Tensor>> grads(ranks);
    std::vector<int64_t> started(ranks), buckets(ranks);
    ASSERT_TRUE(sf::test::on_ranks(ranks, [&](int r) {
        auto sync = std::make_shared<sf::distributed::DataParallelSync>(
            sf::test::thread_rank(r, ranks, port, "nccl", true), 4096);
        grads[r] = grads_of(models[r], c10::Device(c10::kCUDA, r), sync);
        started[r] = sync->buckets_started_in_backward();
        buckets[r] = static_cast<int64_t>(sync->bucket_count());
    }));
    for (int r = 0; r < ranks; ++r) {
        EXPECT_GT(buckets[r], 4);
        EXPECT_EQ(started[r], buckets[r]) << "rank " << r;
        ASSERT_EQ(grads[r].size(), reference.size());
        for (size_t i = 0; i < reference.size(); ++i) {
            EXPECT_TRUE(torch::allclose(grads[r][i], reference[i], 1e-3, 1e-5))
                << "rank " << r << ", parameter " << i;
        }
    }
}

}  // namespace
