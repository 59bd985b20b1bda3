// Writes a seed corpus for each fuzz target, made by the program's own writers: cache records of
// every kind, safetensors files with and without checksums, a shard index, the golden models'
// config.json files, a checkpoint's state.json and manifest.json, a YAML config and image
// headers. Usage: make_seeds <out_dir> <source_dir>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <tuple>

#include "stages/train/state_json.h"
#include "storage/atomic_file.h"
#include "storage/cache.h"
#include "storage/fingerprint.h"
#include "storage/safetensors_file.h"
#include "storage/tensor_record.h"

namespace fs = std::filesystem;
using namespace sf;

namespace {

fs::path out_dir;

// A string literal's bytes, NULs included.
template <size_t N>
std::string bytes_of(const char (&literal)[N]) {
    return std::string(literal, N - 1);
}

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
    fs::create_directories(out_dir / target);
    storage::write_file_atomic((out_dir / target / name).string(), bytes);
}

storage::Record latent_record() {
    storage::Record r;
    r.tensors["latent"] = {storage::DType::kBF16, {4, 2, 2}, std::string(32, '\x3f')};
    r.metadata = {{"source", "img_0.png"}, {"bucket", "512x512"}, {"stage", "encode_vae"}};
    return r;
}

storage::Record every_dtype_record() {
    storage::Record r;
    r.tensors["f32"] = {storage::DType::kF32, {2}, std::string(8, '\1')};
    r.tensors["bf16"] = {storage::DType::kBF16, {3}, std::string(6, '\2')};
    r.tensors["f16"] = {storage::DType::kF16, {1, 1}, std::string(2, '\3')};
    r.tensors["i64"] = {storage::DType::kI64, {1}, std::string(8, '\4')};
    r.tensors["i32"] = {storage::DType::kI32, {}, std::string(4, '\5')};
    r.tensors["u8"] = {storage::DType::kU8, {0}, ""};
    r.tensors["b"] = {storage::DType::kBool, {2}, std::string("\0\1", 2)};
    r.metadata["caption"] = "a photo of a cat";
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: make_seeds <out_dir> <source_dir>\n";
        return 2;
    }
    out_dir = argv[1];
    const fs::path source = argv[2];
    int i = 0;
    for (const storage::Record& r : {latent_record(), every_dtype_record(), storage::Record{}}) {
        const std::string n = std::to_string(i++);
        seed("record", n, storage::encode_record(r));
        seed("safetensors", n, storage::encode_safetensors(r));
        const std::string file = (out_dir / ("tmp-" + n)).string();
        storage::write_safetensors_file(file, r);
        seed("safetensors_file", n, storage::read_file(file));
        storage::write_safetensors_file(file, r, /*with_checksum=*/false);
        seed("safetensors_file", n + "-plain", storage::read_file(file));
        fs::remove(file);
    }
    seed("index", "0", R"({"metadata": {"total_size": 8}, "weight_map": {"a": "s.safetensors"}})");
    // The first byte picks the reader (fuzz_config.cpp): 0 Sana, 1 DC-AE, 2 SANA-Video, 3 Wan VAE,
    // 4 Gemma-2, 5 a scheduler.
    const std::tuple<char, const char*, const char*> configs[] = {
        {'\0', "golden", "transformer"},   {'\0', "golden", "transformer_pe"},
        {'\1', "golden", "vae"},           {'\2', "golden-video", "transformer_video"},
        {'\3', "golden-video", "vae_wan"}, {'\4', "golden", "text_encoder"}};
    for (const auto& [selector, dir, model] : configs) {
        const fs::path config = source / "tests/data" / dir / model / "config.json";
        seed("config", model, std::string(1, selector) + storage::read_file(config.string()));
    }
    // Sana's scheduler as diffusers writes it (-Infinity included), and Wan's.
    seed("config", "scheduler_dpm",
         "\5"
         R"({"_class_name": "DPMSolverMultistepScheduler", "flow_shift": 3.0,
             "prediction_type": "flow_prediction", "use_flow_sigmas": true, "solver_order": 2,
             "lambda_min_clipped": -Infinity, "variance_type": null})");
    seed("config", "scheduler_unipc",
         "\5"
         R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 5.0,
             "prediction_type": "flow_prediction", "use_flow_sigmas": true,
             "disable_corrector": [0, 2], "solver_p": null})");
    train::StateFields state;
    state.step = 2;
    state.sampler_batch = 2;
    state.scaler = {{"scale", 65536.0}};
    state.settings = {{"rank", "4"}, {"data", "00112233445566778899aabbccddeeff"}};
    state.losses = {0.5, 0.25};
    seed("state", "state", "\0" + train::state_json(state));
    seed("state", "manifest",
         "\1" + train::manifest_json({{"state.json", {120, "00112233445566778899aabbccddeeff"}}}));
    seed("state", "fingerprint",
         "\2" + storage::fingerprint_to_json({{"stage", "encode_vae"}, {"dtype", "bf16"}}));
    seed("state", "reject",
         "\3" + storage::reject_to_json({"a.png", "decode_image", "not an image", 1}));
    seed("yaml", "0",
         "# a run\ncache_dir: /tmp/c\nmax_train_steps: 5\nlearning_rate: 1e-3  # c\n"
         "gradient_checkpointing: true\nlora_target_modules: \"to_q,to_k\"\n");
    seed("image_header", "png",
         bytes_of("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\1\0\0\0\0\x80\x08\x02\0\0\0"));
    seed("image_header", "jpeg",
         bytes_of("\xff\xd8\xff\xe1\0\x22"
                  "Exif\0\0MM\0\x2a\0\0\0\x08\0\1\x01\x12\0\3\0\0\0\1"
                  "\0\6\0\0\0\0\0\0\xff\xc0\0\x11\x08\0\x10\0\x20\x03\x01\x22\0\x02\x11\x01"
                  "\x03\x11\x01\xff\xd9"));
    std::cout << "seeds in " << out_dir.string() << "\n";
    return 0;
}
