// Helpers shared by the storage tests: temporary directories and deterministic records.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>

#include "core/error.h"
#include "storage/tensor_record.h"
#include "test_util.h"

namespace sf::storage::testing {

using sf::test::TempDir;

template <typename T>
TensorData make_tensor(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    TensorData t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    return t;
}

// Bytes that look like a tensor of `dtype` and `shape`, generated from `seed`: partly repetitive
// so zstd has something to compress, never an invalid bool.
inline TensorData pattern_tensor(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    TensorData t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    size_t n = static_cast<size_t>(shape_numel(t.shape)) * dtype_size(dtype);
    std::mt19937 rng(seed);
    t.bytes.resize(n);
    for (size_t i = 0; i < n; ++i) {
        unsigned char b =
            (i % 7 < 3) ? static_cast<unsigned char>(rng()) : static_cast<unsigned char>(i / 7);
        t.bytes[i] = static_cast<char>(dtype == DType::kBool ? (b & 1) : b);
    }
    return t;
}

// One tensor of every dtype, plus a 0-d and an empty tensor, plus metadata.
inline Record every_dtype_record(uint32_t seed = 1) {
    Record r;
    r.tensors["f32"] = pattern_tensor(DType::kF32, {2, 3}, seed);
    r.tensors["bf16"] = pattern_tensor(DType::kBF16, {4, 5}, seed + 1);
    r.tensors["f16"] = pattern_tensor(DType::kF16, {3}, seed + 2);
    r.tensors["i64"] = pattern_tensor(DType::kI64, {2, 2}, seed + 3);
    r.tensors["i32"] = pattern_tensor(DType::kI32, {5}, seed + 4);
    r.tensors["u8"] = pattern_tensor(DType::kU8, {7}, seed + 5);
    r.tensors["bool"] = pattern_tensor(DType::kBool, {9}, seed + 6);
    r.tensors["scalar"] = pattern_tensor(DType::kF32, {}, seed + 7);
    r.tensors["empty"] = pattern_tensor(DType::kBF16, {0, 4}, seed + 8);
    r.metadata["source"] = "images/cat.jpg";
    r.metadata["bucket"] = "1024x768";
    return r;
}

// Runs `fn` and returns the category of the sf::Error it throws; fails the test when it throws
// anything else or nothing.
inline std::optional<ErrorCode> error_code_of(const std::function<void()>& fn,
                                              std::string* message = nullptr) {
    try {
        fn();
    } catch (const Error& e) {
        if (message) *message = e.what();
        return e.code();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "threw a non-sf::Error: " << e.what();
        return std::nullopt;
    }
    return std::nullopt;
}

}  // namespace sf::storage::testing
