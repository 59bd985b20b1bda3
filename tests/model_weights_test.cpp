// Loading weights by name: round trip, dtype conversion, and one error naming every bad tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "model/common/weights.h"
#include "model_golden_util.h"
#include "test_util.h"

namespace {

// Two levels of names, a buffer, and a ModuleList: "blocks.0.proj.weight", as Python names them.
struct TinyImpl : torch::nn::Module {
    explicit TinyImpl(int width) {
        proj_in = register_module("proj_in", torch::nn::Linear(4, width));
        blocks = register_module("blocks", torch::nn::ModuleList());
        for (int i = 0; i < 2; ++i) blocks->push_back(torch::nn::Linear(width, width));
        table = register_parameter("scale_shift_table", torch::randn({2, width}));
        register_buffer("running", torch::zeros({width}));
    }
    torch::nn::Linear proj_in{nullptr};
    torch::nn::ModuleList blocks{nullptr};
    torch::Tensor table;
};
TORCH_MODULE(Tiny);

TEST(Weights, SaveThenLoadByNameReproducesEveryTensor) {
    sf::test::TempDir tmp("sf_weights");
    torch::manual_seed(1);
    Tiny a(8);
    sf::model::save_weights(*a, tmp.file("w.safetensors"));
    torch::manual_seed(2);
    Tiny b(8);
    auto report = sf::model::load_weights(*b, tmp.file("w.safetensors"));
    EXPECT_EQ(report.tensors, 8);  // 2 + 2*2 linear tensors, table, buffer
    auto sa = sf::model::state_dict(*a), sb = sf::model::state_dict(*b);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
        EXPECT_EQ(sa[i].first, sb[i].first);
        EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << sa[i].first;
    }
    const bool has_list_name = std::any_of(
        sa.begin(), sa.end(), [](const auto& kv) { return kv.first == "blocks.0.weight"; });
    EXPECT_TRUE(has_list_name);
    EXPECT_EQ(sf::model::parameter_count(*a), 4 * 8 + 8 + 2 * (8 * 8 + 8) + 2 * 8);
}

TEST(Weights, ConvertsDtypeOnLoad) {
    sf::test::TempDir tmp("sf_weights");
    Tiny a(8);
    sf::model::save_weights(*a, tmp.file("w.safetensors"));
    Tiny b(8);
    sf::model::LoadOptions options;
    options.dtype = torch::kBFloat16;
    sf::model::load_weights(*b, tmp.file("w.safetensors"), options);
    EXPECT_EQ(b->proj_in->weight.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(b->proj_in->weight, a->proj_in->weight.to(torch::kBFloat16)));
}

TEST(Weights, ReportsEveryMissingUnexpectedAndMisshapedTensorAtOnce) {
    sf::test::TempDir tmp("sf_weights");
    Tiny a(8);
    sf::model::save_weights(*a, tmp.file("w.safetensors"));
    // Width 6: every tensor but proj_in's... all misshaped; and a module with an extra block.
    Tiny wrong(6);
    try {
        sf::model::load_weights(*wrong, tmp.file("w.safetensors"));
        FAIL() << "misshaped weights must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument);
        EXPECT_NE(msg.find("8 misshaped"), std::string::npos) << msg;
        EXPECT_NE(msg.find("blocks.1.weight: checkpoint has [8, 8], model wants [6, 6]"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("w.safetensors"), std::string::npos) << msg;
    }
    Tiny extra(8);
    extra->blocks->push_back(torch::nn::Linear(8, 8));
    extra->register_parameter("only_here", torch::zeros({3}));
    try {
        sf::model::load_weights(*extra, tmp.file("w.safetensors"));
        FAIL() << "missing weights must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("3 missing"), std::string::npos) << msg;
        EXPECT_NE(msg.find("blocks.2.weight [8, 8]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("only_here [3]"), std::string::npos) << msg;
    }
    Tiny fewer(8);
    fewer->blocks = fewer->replace_module("blocks", torch::nn::ModuleList(torch::nn::Linear(8, 8)));
    try {
        sf::model::load_weights(*fewer, tmp.file("w.safetensors"));
        FAIL() << "unexpected weights must be refused";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("2 unexpected"), std::string::npos) << msg;
        EXPECT_NE(msg.find("blocks.1.bias"), std::string::npos) << msg;
    }
}

TEST(Weights, LoadsAnUpstreamDiffusersFileByName) {
    // The golden transformer file is written by diffusers itself: keys as upstream saves them.
    SF_REQUIRE_GOLDEN("transformer/diffusion_pytorch_model.safetensors");
    const std::string path =
        sf::test::golden_path("transformer/diffusion_pytorch_model.safetensors");
    Tiny unrelated(8);
    try {
        sf::model::load_weights(*unrelated, path);
        FAIL();
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("transformer_blocks.0.attn1.to_q.weight"),
                  std::string::npos);
    }
}

}  // namespace
