#include "tools/demo/demo.h"

#include <filesystem>
#include <iostream>

#include "core/log.h"
#include "core/memory.h"
#include "pipelines/inspect.h"
#include "pipelines/prep/prep.h"
#include "pipelines/train/train.h"
#include "tools/demo/demo_data.h"
#include "tools/demo/demo_video.h"

namespace sf::tools {
namespace {

namespace fs = std::filesystem;
using pipelines::PrepOptions;
using pipelines::TrainOptions;

// The demo's video part: generated clips -> prep through the Wan VAE into 9-frame windows -> 20
// steps of the tiny SANA-Video transformer with image-to-video batches and the chunked
// feed-forward -> a validation video of one caption, decoded by the same Wan VAE.
void run_demo_video(const fs::path& root) {
    const fs::path clips = root / "clips";
    sf::tools::write_demo_clips(clips.string(), 2, 18, /*seed=*/1234);
    PrepOptions o;
    o.instance_data_dir = clips.string();
    o.cache_dir = (root / "video-cache").string();
    o.resolution = 512;
    o.min_side = 32;
    o.vae_kind = "wan";
    o.windows.frame_extraction = sf::stages::FrameExtraction::kChunk;
    o.windows.target_frames = {9};
    const std::string prompt = "a sliding gradient, clip number 0";
    o.validation_prompts = {prompt};
    std::cout << "\n== 2 generated clips of 18 frames; sanaflow prep --instance_data_dir "
              << o.instance_data_dir << " --cache_dir " << o.cache_dir
              << " --resolution 512 --min_side 32 --vae wan --frame_extraction chunk "
                 "--target_frames 9 --validation_prompt \""
              << prompt << "\"\n";
    std::cout << sf::pipelines::run_prep(o).table();

    TrainOptions t;
    t.cache_dir = o.cache_dir;
    t.output_dir = (root / "video-train").string();
    t.rank = 0;  // a full fine-tune without warmup
    t.lr_warmup_steps = 0;
    t.max_train_steps = 20;
    t.train_batch_size = 2;
    t.learning_rate = 1e-3;
    t.checkpointing_steps = 0;
    t.gradient_checkpointing = 1;
    t.i2v_probability = 0.3;
    t.ff_chunk_size = 1;
    t.validation_prompts = {prompt};
    t.num_validation_images = 1;
    t.validation_steps = 20;
    t.validation_inference_steps = 10;
    std::cout << "\n== sanaflow train --cache_dir " << t.cache_dir << " --output_dir "
              << t.output_dir
              << " --full_finetune --max_train_steps 20 --train_batch_size 2 --learning_rate 1e-3 "
                 "--lr_warmup_steps 0 --gradient_checkpointing --i2v_probability 0.3 "
                 "--ff_chunk_size 1 --checkpointing_steps 0 --validation_prompt \""
              << prompt
              << "\" --num_validation_images 1 --validation_steps 20 "
                 "--validation_inference_steps 10\n";
    std::cout << sf::pipelines::run_train(t).summary();
}

}  // namespace

int run_demo(const std::string& out_dir, int num_images) {
    const fs::path root(out_dir);
    const fs::path data = root / "data";
    const fs::path cache = root / "cache";
    sf::log_info("demo: writing {} generated images with captions to {}", num_images,
                 data.string());
    auto stats = sf::tools::write_demo_dataset(data.string(), num_images, /*seed=*/1234);
    sf::log_info("demo: {} images and {} deliberately bad files", stats.images, stats.bad_files);

    PrepOptions o;
    o.instance_data_dir = data.string();
    o.cache_dir = cache.string();
    o.resolution = 512;
    const std::string prompt = "a red circle on a dark background";
    o.validation_prompts = {prompt};
    std::cout << "== sanaflow prep --instance_data_dir " << data.string() << " --cache_dir "
              << cache.string() << " --resolution 512 --validation_prompt \"" << prompt << "\"\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== the same prep again: everything is cached, nothing is decoded\n";
    std::cout << sf::pipelines::run_prep(o).table();
    std::cout << "\n== sanaflow inspect " << cache.string() << " --verify\n";
    auto result = sf::pipelines::inspect_cache(cache.string(), /*verify=*/true);
    std::cout << result.text;
    if (!result.ok) return 3;

    TrainOptions t;
    t.cache_dir = cache.string();
    t.output_dir = (root / "train").string();
    t.rank = 0;  // a full fine-tune
    t.max_train_steps = 40;
    t.train_batch_size = 2;
    t.learning_rate = 1e-3;
    t.lr_scheduler = "constant_with_warmup";
    t.lr_warmup_steps = 5;
    t.checkpointing_steps = 20;
    t.checkpoints_total_limit = 1;
    t.gradient_checkpointing = 1;
    t.attention = "chunked";
    t.caption_dropout = 0.1;
    t.validation_prompts = {prompt};
    t.num_validation_images = 2;
    t.validation_steps = 20;
    t.validation_inference_steps = 10;
    std::cout
        << "\n== sanaflow train --cache_dir " << t.cache_dir << " --output_dir " << t.output_dir
        << " --full_finetune --max_train_steps 40 --train_batch_size 2 --learning_rate 1e-3 "
           "--lr_scheduler "
           "constant_with_warmup"
           " --lr_warmup_steps 5 --gradient_checkpointing --attention chunked --caption_dropout 0.1"
           " --checkpointing_steps 20 --checkpoints_total_limit 1 --validation_prompt \""
        << prompt
        << "\" --num_validation_images 2 --validation_steps 20 --validation_inference_steps "
           "10\n";
    std::cout << sf::pipelines::run_train(t).summary();
    run_demo_video(root);
    std::cout << "\n== memory marks\n" << sf::mem::memory_log().table();
    return 0;
}

}  // namespace sf::tools
