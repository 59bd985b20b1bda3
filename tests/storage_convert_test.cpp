// at::Tensor <-> TensorData, and through a whole record. The only storage test with ATen.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "storage/tensor_convert.h"
#include "storage/tensor_record.h"
#include "storage_test_util.h"

namespace sf::storage {
namespace {

at::Tensor sample(at::ScalarType type, at::IntArrayRef shape) {
    at::Tensor t = at::arange(0, std::max<int64_t>(1, c10::multiply_integers(shape)), at::kFloat)
                       .slice(0, 0, c10::multiply_integers(shape))
                       .reshape(shape);
    if (type == at::kBool) return (t.remainder(3) == 0);
    return (t * 1.5 - 3).to(type);
}

TEST(StorageConvert, EveryDTypeRoundTripsThroughARecord) {
    const std::pair<at::ScalarType, DType> types[] = {
        {at::kFloat, DType::kF32}, {at::kBFloat16, DType::kBF16}, {at::kHalf, DType::kF16},
        {at::kLong, DType::kI64},  {at::kInt, DType::kI32},       {at::kByte, DType::kU8},
        {at::kBool, DType::kBool}};
    const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {}, {0}, {3, 0, 2}, {5}};
    for (const auto& [type, dtype] : types) {
        for (const auto& shape : shapes) {
            at::Tensor t = sample(type, shape);
            TensorData data = to_tensor_data(t);
            EXPECT_EQ(data.dtype, dtype);
            EXPECT_EQ(data.shape, shape);
            Record r;
            r.tensors["t"] = data;
            Record back = decode_record(encode_record(r), "k");
            at::Tensor u = from_tensor_data(back.tensors.at("t"));
            EXPECT_EQ(u.scalar_type(), type);
            EXPECT_EQ(u.sizes(), t.sizes());
            EXPECT_TRUE(at::equal(u, t)) << c10::toString(type);
        }
    }
}

TEST(StorageConvert, NonContiguousTensorIsCopiedInLogicalOrder) {
    at::Tensor t = at::arange(6, at::kFloat).reshape({2, 3}).t();  // [3, 2], strided
    at::Tensor u = from_tensor_data(to_tensor_data(t));
    EXPECT_TRUE(at::equal(u, t));
    EXPECT_EQ(u.sizes(), (std::vector<int64_t>{3, 2}));
}

TEST(StorageConvert, ViewSharesTheTensorBytes) {
    at::Tensor t = at::ones({4}, at::kBFloat16);
    TensorView v = view_of(t);
    EXPECT_EQ(v.bytes.data(), static_cast<const char*>(t.data_ptr()));
    EXPECT_EQ(v.bytes.size(), 8u);
    EXPECT_THROW(view_of(t.reshape({2, 2}).t()), Error);
}

TEST(StorageConvert, UnsupportedDTypeIsInvalidArgument) {
    at::Tensor t = at::zeros({2}, at::kComplexFloat);
    EXPECT_EQ(testing::error_code_of([&] { to_tensor_data(t); }), ErrorCode::kInvalidArgument);
}

TEST(StorageConvert, WrongByteCountIsInvalidArgument) {
    TensorData d{DType::kF32, {3}, std::string(8, '\0')};
    EXPECT_EQ(testing::error_code_of([&] { from_tensor_data(d); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace sf::storage
