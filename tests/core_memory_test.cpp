// The memory meter: exact byte counts, peaks, the byte budget in forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/host_memory.h"
#include "core/log.h"
#include "core/memory.h"

namespace {

using sf::mem::cpu_stats;

TEST(MemoryMeter, CountsExactBytesOfKnownAllocations) {
    ASSERT_TRUE(sf::mem::counting_allocator_installed());
    const int64_t before = cpu_stats().current;
    const int64_t live_before = sf::mem::cpu_live_allocations();
    {
        auto a = torch::empty({1000}, torch::kFloat32);    // 4000 bytes
        auto b = torch::empty({10, 10}, torch::kFloat64);  // 800 bytes
        auto c = torch::empty({3, 7}, torch::kBFloat16);   // 42 bytes
        EXPECT_EQ(cpu_stats().current - before, 4000 + 800 + 42);
        EXPECT_EQ(sf::mem::cpu_live_allocations() - live_before, 3);
        auto view = a.slice(0, 0, 10);  // a view allocates nothing
        EXPECT_EQ(cpu_stats().current - before, 4842);
    }
    EXPECT_EQ(cpu_stats().current, before);
    EXPECT_EQ(sf::mem::cpu_live_allocations(), live_before);
}

// Host memory (block swap, optimizer offload) is counted apart from the device's tensor bytes.
TEST(MemoryMeter, HostMemoryIsCountedApartAndOpsOnItStayThere) {
    const int64_t before = cpu_stats().current, host_before = sf::mem::host_stats().current;
    const at::Tensor t = torch::arange(12, torch::kFloat32).reshape({3, 4}).t();  // not contiguous
    const int64_t with_t = cpu_stats().current;
    {
        at::Tensor h = sf::mem::to_host(t, /*pinned=*/false);
        at::Tensor z = sf::mem::host_zeros_like(h);
        EXPECT_TRUE(sf::mem::in_host_memory(h));
        EXPECT_TRUE(sf::mem::in_host_memory(z));
        EXPECT_FALSE(sf::mem::in_host_memory(t));
        EXPECT_TRUE(torch::equal(h, t));
        EXPECT_EQ(cpu_stats().current, with_t);  // nothing counted on the "device"
        EXPECT_EQ(sf::mem::host_stats().current - host_before, 2 * 12 * 4);
        z.add_(h);  // in place: stays in host memory
        EXPECT_TRUE(sf::mem::in_host_memory(z));
        EXPECT_TRUE(torch::equal(z, t));
        EXPECT_EQ(cpu_stats().current, with_t);
    }
    EXPECT_EQ(sf::mem::host_stats().current, host_before);
    EXPECT_GT(with_t, before);
}

TEST(MemoryMeter, PeakTracksHighWaterMarkAndResets) {
    sf::mem::reset_peak();
    const int64_t base = cpu_stats().current;
    {
        auto big = torch::empty({1 << 20}, torch::kUInt8);  // 1 MiB
    }
    auto small = torch::empty({1024}, torch::kUInt8);
    EXPECT_EQ(cpu_stats().peak - base, 1 << 20);
    sf::mem::reset_peak();
    EXPECT_EQ(cpu_stats().peak, cpu_stats().current);
}

TEST(MemoryMeter, CountsAutogradSavedTensors) {
    auto w = torch::randn({256, 256}, torch::requires_grad());
    auto x = torch::randn({64, 256});
    const int64_t before = cpu_stats().current;
    auto y = torch::relu(torch::mm(x, w));  // saves x (already live) and relu's output
    // y itself is 64*256*4 bytes; the mm result is freed or kept by relu's saved output.
    EXPECT_GE(cpu_stats().current - before, 64 * 256 * 4);
    y.sum().backward();
    EXPECT_TRUE(w.grad().defined());
}

// One forward-backward step of a small MLP; returns the loss.
float train_step(torch::nn::Sequential& net, const torch::Tensor& x) {
    net->zero_grad();
    auto loss = net->forward(x).pow(2).mean();
    loss.backward();
    return loss.item<float>();
}

TEST(MemoryMeter, BudgetThrowsInForwardAndRetrySucceeds) {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(512, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 512));
    auto x = torch::randn({256, 512});
    const int64_t base = cpu_stats().current;
    const int64_t live = sf::mem::cpu_live_allocations();
    {
        sf::mem::BudgetGuard budget(base + 1024 * 1024);  // the 256x2048 activation alone is 2 MiB
        EXPECT_THROW(train_step(net, x), c10::OutOfMemoryError);
    }
    // Nothing the failed step allocated is still held.
    EXPECT_EQ(cpu_stats().current, base);
    EXPECT_EQ(sf::mem::cpu_live_allocations(), live);
    EXPECT_TRUE(std::isfinite(train_step(net, x)));
}

TEST(MemoryMeter, BudgetThrowsInBackward) {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(512, 2048), torch::nn::ReLU(),
                              torch::nn::Linear(2048, 512));
    auto x = torch::randn({256, 512});
    train_step(net, x);  // gradients exist now, so the measured step allocates no new .grad
    net->zero_grad();
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();

    // Measure what forward alone needs, then allow that plus a little: backward must fail.
    sf::mem::reset_peak();
    const int64_t base = cpu_stats().current;
    auto loss = net->forward(x).pow(2).mean();
    const int64_t after_forward_peak = cpu_stats().peak;
    bool threw = false;
    {
        sf::mem::BudgetGuard budget(after_forward_peak + 4096);
        try {
            loss.backward();
        } catch (const c10::OutOfMemoryError& e) {
            threw = true;
            EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos);
        }
    }
    EXPECT_TRUE(threw);
    loss = torch::Tensor();
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    EXPECT_EQ(cpu_stats().current, base);
    EXPECT_TRUE(std::isfinite(train_step(net, x)));
}

TEST(MemoryMeter, BFloat16OpsWorkThroughCountingAllocator) {
    // oneDNN's bf16 kernels assert that a DataPtr's context equals its data pointer.
    auto a = torch::randn({64, 64}).to(torch::kBFloat16);
    auto b = torch::randn({64, 64}).to(torch::kBFloat16);
    auto c = torch::mm(a, b);
    EXPECT_EQ(c.scalar_type(), torch::kBFloat16);
    auto ref = torch::mm(a.to(torch::kFloat32), b.to(torch::kFloat32));
    EXPECT_TRUE(torch::allclose(c.to(torch::kFloat32), ref, 0.05, 0.5));
}

TEST(MemoryMeter, MarksCollectIntoATable) {
    sf::mem::MemoryLog log;
    log.set_verbose(false);
    auto t = torch::empty({1 << 18}, torch::kFloat32);  // 1 MiB
    auto m = log.mark("encode_vae", "after load");
    EXPECT_GE(m.cpu.current, 1 << 20);
    EXPECT_GT(m.rss, 0);
    EXPECT_GE(m.peak_rss, m.rss);
    log.mark("encode_vae", "after free");
    ASSERT_EQ(log.marks().size(), 2u);
    const std::string table = log.table();
    EXPECT_NE(table.find("after load"), std::string::npos);
    EXPECT_NE(table.find("encode_vae"), std::string::npos);
}

TEST(MemoryMeter, PeakRssRisesWithTouchedMemory) {
    sf::mem::empty_cache();  // a pooled block would be touched already
    sf::mem::reset_peak();
    const int64_t before = sf::mem::peak_rss_bytes();
    {
        auto t = torch::ones({64 << 20}, torch::kUInt8);  // 64 MiB, touched
    }
    EXPECT_GE(sf::mem::peak_rss_bytes() - before, 48 << 20);
}

TEST(MemoryPool, ReusesLargeBlocksAndCountsOnlyTensorBytes) {
    sf::mem::empty_cache();
    ASSERT_EQ(sf::mem::cpu_pooled_bytes(), 0);
    const int64_t before = cpu_stats().current;
    void* first = nullptr;
    {
        auto t = torch::empty({3 << 20}, torch::kUInt8);  // 3 MiB: pooled on free
        first = t.data_ptr();
        EXPECT_EQ(cpu_stats().current - before, 3 << 20);
    }
    EXPECT_EQ(cpu_stats().current, before);  // pooled bytes are not tensor bytes
    EXPECT_GE(sf::mem::cpu_pooled_bytes(), 3 << 20);
    {
        auto t = torch::empty({3 << 20}, torch::kUInt8);
        EXPECT_EQ(t.data_ptr(), first);  // the same block again, no new mapping
        EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
    }
    {
        auto small = torch::empty({1000}, torch::kUInt8);  // below the pool's minimum
        EXPECT_NE(small.data_ptr(), first);
    }
    sf::mem::empty_cache();
    EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
}

TEST(MemoryPool, NeverHoldsMoreThanThePeakOfLiveBlocks) {
    sf::mem::empty_cache();
    { auto a = torch::empty({8 << 20}, torch::kUInt8); }  // peak of live blocks: ~8 MiB
    EXPECT_GE(sf::mem::cpu_pooled_bytes(), 8 << 20);
    {
        // 20 MiB cannot use the 8 MiB block; mapping it beside the pooled one would hold 28 MiB,
        // more than the process ever had live, so the pooled block is unmapped first.
        auto b = torch::empty({20 << 20}, torch::kUInt8);
        EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
    }
    sf::mem::set_cpu_pool_limit(0);  // pooling off: every free unmaps
    { auto c = torch::empty({4 << 20}, torch::kUInt8); }
    EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
    sf::mem::set_cpu_pool_limit(int64_t{4} << 30);
    sf::mem::empty_cache();
}

// Whether the first `mib` MiB of t hold what a freed torch::ones left there: the pages of a pooled
// block, reused (a new mapping's pages are zeros).
bool holds_old_ones(const at::Tensor& t, int64_t mib) {
    return t.narrow(0, 0, mib << 20).eq(1).all().item<bool>();
}

TEST(MemoryPool, AFarSmallerTensorTakesTheHeadOfAPooledBlockAndItsTailStaysPooled) {
    sf::mem::empty_cache();
    void* first = nullptr;
    {
        auto a = torch::ones({32 << 20}, torch::kUInt8);  // 32 MiB, touched, pooled on free
        first = a.data_ptr();
    }
    ASSERT_GE(sf::mem::cpu_pooled_bytes(), 32 << 20);
    const int64_t rss = sf::mem::rss_bytes();
    {
        auto b = torch::empty({4 << 20}, torch::kUInt8);   // an eighth: no close fit
        EXPECT_EQ(b.data_ptr(), first);                    // the block's head
        EXPECT_GE(sf::mem::cpu_pooled_bytes(), 27 << 20);  // the tail, a block of its own
        auto c = torch::empty({20 << 20}, torch::kUInt8);  // fits in the tail
        EXPECT_TRUE(holds_old_ones(b, 4));
        EXPECT_TRUE(holds_old_ones(c, 20));                // the tail's pages, not a new mapping's
        EXPECT_GE(sf::mem::rss_bytes(), rss - (2 << 20));  // nothing went back and came again
    }
    sf::mem::empty_cache();
}

TEST(MemoryPool, ALargerTensorGrowsAPooledBlockWhosePagesStayResident) {
    sf::mem::empty_cache();
    { auto a = torch::ones({16 << 20}, torch::kUInt8); }  // 16 MiB, touched, pooled on free
    ASSERT_GE(sf::mem::cpu_pooled_bytes(), 16 << 20);
    {
        // No larger block: the 16 MiB one grows to 40, and only its 24 MiB tail is new.
        auto b = torch::empty({40 << 20}, torch::kUInt8);
        EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
        EXPECT_TRUE(holds_old_ones(b, 15));
    }
    EXPECT_GE(sf::mem::cpu_pooled_bytes(), 40 << 20);  // the grown block, pooled again
    sf::mem::empty_cache();
}

TEST(MemoryPool, ReleaseAtAPhaseBoundaryEmptiesThePool) {
    sf::mem::empty_cache();
    { auto t = torch::empty({5 << 20}, torch::kUInt8); }
    ASSERT_GE(sf::mem::cpu_pooled_bytes(), 5 << 20);
    EXPECT_GE(sf::mem::release_memory("test"), 5 << 20);
    EXPECT_EQ(sf::mem::cpu_pooled_bytes(), 0);
}

TEST(MemoryPool, BudgetStillCountsRequestedBytes) {
    sf::mem::empty_cache();
    { auto warm = torch::empty({6 << 20}, torch::kUInt8); }  // pooled, 6 MiB and change
    const int64_t base = cpu_stats().current;
    sf::mem::BudgetGuard guard(base + (5 << 20));
    EXPECT_THROW(torch::empty({6 << 20}, torch::kUInt8), c10::Error);  // over, even though pooled
    auto fits = torch::empty({4 << 20}, torch::kUInt8);
    EXPECT_EQ(cpu_stats().current - base, 4 << 20);
}

TEST(FormatBytes, HumanUnits) {
    EXPECT_EQ(sf::format_bytes(512), "512 B");
    EXPECT_EQ(sf::format_bytes(1536), "1.50 KiB");
    EXPECT_EQ(sf::format_bytes(3LL << 30), "3.00 GiB");
}

}  // namespace
