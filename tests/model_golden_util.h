// Helpers for the upstream golden tests (tests/data/golden, see its README.md): paths, loading a
// reference safetensors file into tensors, and comparing tensors with a tolerance that reports
// the largest errors, so a failing or a passing golden test says how close it came.
//
// Shared by every model test (transformer, DC-AE, Gemma-2): keep the API stable.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "storage/safetensors_file.h"
#include "storage/tensor_convert.h"

namespace sf::test {

// The golden README's fp32 tolerances: of forward outputs (samples, latents, decoded images) and
// of gradients.
constexpr double kForwardRtol = 1e-4, kForwardAtol = 1e-5;
constexpr double kGradRtol = 1e-3, kGradAtol = 1e-5;

// SANAFLOW_TEST_DATA/golden/<rel>, e.g. golden_path("transformer") or
// golden_path("refs/transformer_forward.safetensors").
inline std::string golden_path(const std::string& rel) {
    return (std::filesystem::path(SANAFLOW_TEST_DATA) / "golden" / rel).string();
}

// SANAFLOW_TEST_DATA/golden-video/<rel>: the upstream video models (Wan VAE, SANA-Video DiT).
inline std::string golden_video_path(const std::string& rel) {
    return (std::filesystem::path(SANAFLOW_TEST_DATA) / "golden-video" / rel).string();
}

// A reference file under golden/refs, or golden-video/refs, by file name.
inline std::string ref_path(const std::string& file) { return golden_path("refs/" + file); }
inline std::string video_ref_path(const std::string& file) {
    return golden_video_path("refs/" + file);
}

// The golden data is committed with the tests: a test that needs it fails without it (it never
// skips, or a lost directory would pass every golden test silently).
#define SF_REQUIRE_GOLDEN(rel)                                              \
    do {                                                                    \
        if (!std::filesystem::exists(sf::test::golden_path(rel))) {         \
            FAIL() << "golden data missing: " << sf::test::golden_path(rel) \
                   << " (committed under tests/data/golden; restore it)";   \
        }                                                                   \
    } while (0)

// Every tensor of a safetensors file, copied into CPU tensors (dtype as stored). `file` is a path,
// or a bare file name under golden/refs. Throws sf::Error naming the file when it cannot be read.
inline std::map<std::string, at::Tensor> load_ref(const std::string& file) {
    const std::string path = file.find('/') == std::string::npos ? ref_path(file) : file;
    const auto st = storage::SafetensorsFile::open(path);
    std::map<std::string, at::Tensor> out;
    for (const std::string& name : st.names()) out[name] = storage::from_tensor_data(st.read(name));
    return out;
}

// The largest errors of one comparison, in the expected tensor's terms.
struct CloseStats {
    double max_abs = 0.0;  // max |actual - expected|
    double max_rel = 0.0;  // max |actual - expected| / |expected| over elements with expected != 0
    // max |actual - expected| / (atol + rtol |expected|): at most 1 when the tensors are close.
    double worst_ratio = 0.0;
    int64_t bad = 0;  // elements outside the tolerance (NaN mismatches included)
    bool ok = false;
};

// Compares element-wise as torch.allclose does, |a - e| <= atol + rtol |e|, in fp64, after
// checking that shapes match; NaN equals NaN only where both are NaN. Adds a gtest failure naming
// `name` on a mismatch, and always prints one line with the max errors (the golden tests report
// them). Returns the statistics so a test can report or assert more.
inline CloseStats expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                               double atol, const std::string& name) {
    CloseStats stats;
    if (actual.sizes() != expected.sizes()) {
        std::ostringstream msg;
        msg << name << ": shape " << actual.sizes() << " != expected " << expected.sizes();
        ADD_FAILURE() << msg.str();
        return stats;
    }
    const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble);
    const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble);
    const at::Tensor both_nan = at::isnan(a) & at::isnan(e);
    const at::Tensor diff = (a - e).abs().masked_fill(both_nan, 0.0);
    const at::Tensor limit = atol + rtol * e.abs();
    // NaN in diff (one side NaN) fails the comparison below, as it should.
    const at::Tensor within = diff.le(limit);
    stats.bad = expected.numel() - within.sum().item<int64_t>();
    if (expected.numel() > 0) {
        const at::Tensor finite_diff = at::nan_to_num(diff, 0.0, 0.0, 0.0);
        stats.max_abs = finite_diff.max().item<double>();
        const at::Tensor nonzero = e.ne(0.0);
        if (nonzero.any().item<bool>()) {
            stats.max_rel = (finite_diff / e.abs()).masked_select(nonzero).max().item<double>();
        }
        stats.worst_ratio = (finite_diff / limit).max().item<double>();
    }
    stats.ok = stats.bad == 0;
    std::printf("[ golden   ] %-60s max_abs %.3e  max_rel %.3e  worst/tol %.3f%s\n", name.c_str(),
                stats.max_abs, stats.max_rel, stats.worst_ratio, stats.ok ? "" : "  MISMATCH");
    if (!stats.ok) {
        ADD_FAILURE() << name << ": " << stats.bad << " of " << expected.numel()
                      << " elements outside rtol " << rtol << " / atol " << atol << " (max abs "
                      << stats.max_abs << ", max rel " << stats.max_rel << ")";
    }
    return stats;
}

}  // namespace sf::test

#define SF_REQUIRE_GOLDEN_VIDEO(rel)                                              \
    do {                                                                          \
        if (!std::filesystem::exists(sf::test::golden_video_path(rel))) {         \
            FAIL() << "golden data missing: " << sf::test::golden_video_path(rel) \
                   << " (committed under tests/data/golden-video; restore it)";   \
        }                                                                         \
    } while (0)
