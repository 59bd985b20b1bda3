// End to end: generated images -> `sanaflow prep` -> cache, through the library and the program.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/memory.h"
#include "integration_util.h"
#include "model/dc_ae/autoencoder_dc_config.h"
#include "pipelines/inspect.h"
#include "pipelines/prep/prep.h"
#include "storage/cache.h"
#include "storage/cache_reader.h"
#include "storage/cache_schema.h"
#include "storage/cache_writer.h"
#include "storage/tensor_record.h"
#include "test_util.h"

namespace {

using sf::pipelines::PrepOptions;
using sf::pipelines::run_prep;
using sf::test::kSanaflow;
using sf::test::options_for;
using sf::test::TempDir;
using sf::test::write_dataset;
using sf::test::write_image;

int64_t samples_in(const std::string& cache_dir) {
    return static_cast<int64_t>(
        sf::storage::CacheReader(sf::storage::Cache::open(cache_dir), "samples").count());
}

TEST(PrepIntegration, CachesSamplesRejectsBadOnesAndResumes) {
    TempDir tmp("sf_prep");
    write_dataset(tmp.path() / "data", 0, 12);
    sf::test::write_file(tmp.path() / "data" / "cut.jpg",
                         std::string("\xFF\xD8\xFF\xE0garbage", 10));
    sf::test::write_file(tmp.path() / "data" / "cut.txt", "a cut file");
    cv::imwrite(tmp.file("data/small.png"), cv::Mat(64, 64, CV_8UC3, cv::Scalar(1, 2, 3)));
    sf::test::write_file(tmp.path() / "data" / "small.txt", "too small");
    cv::imwrite(tmp.file("data/nocaption.png"), cv::Mat(300, 300, CV_8UC3, cv::Scalar(1, 2, 3)));

    const PrepOptions o = options_for(tmp);
    auto first = run_prep(o);
    EXPECT_EQ(first.scanned, 14);  // the caption-less image is a scan reject
    EXPECT_EQ(first.written, 12);
    EXPECT_EQ(first.cached, 0);
    EXPECT_EQ(first.rejected, 3);

    auto cache = sf::storage::Cache::open(o.cache_dir);
    auto small = cache.reject(tmp.file("data/small.png"));
    ASSERT_TRUE(small.has_value());
    EXPECT_NE(small->reason.find("too small"), std::string::npos) << small->reason;
    auto cut = cache.reject(tmp.file("data/cut.jpg"));
    ASSERT_TRUE(cut.has_value());
    EXPECT_EQ(cut->stage, "decode");
    ASSERT_TRUE(cache.reject(tmp.file("data/nocaption.png")).has_value());

    // Each record names its source, bucket and caption.
    sf::storage::CacheReader reader(cache, "samples");
    std::set<std::string> buckets;
    reader.for_each([&](std::string_view key, std::string_view frame) {
        auto r = sf::storage::decode_record(frame, std::string(key));
        buckets.insert(r.metadata.at("bucket"));
        EXPECT_NE(r.metadata.at("caption").find("picture number"), std::string::npos);
        EXPECT_EQ(r.tensors.at("bucket_size").shape, std::vector<int64_t>{2});
    });
    EXPECT_GE(buckets.size(), 3u);

    // Latents and text features: one latent per image, one text record per distinct caption.
    EXPECT_EQ(first.latents_written, 12);
    EXPECT_EQ(first.texts_written, 14);  // the two bad images have captions too
    EXPECT_EQ(first.models_loaded, (std::vector<std::string>{"encode_text", "encode_vae"}));
    sf::storage::CacheReader latents(cache, "latents");
    EXPECT_EQ(latents.count(), 12u);
    latents.for_each([&](std::string_view key, std::string_view frame) {
        auto r = sf::storage::decode_record(frame, std::string(key));
        const auto& latent = r.tensors.at("latent");
        ASSERT_EQ(latent.shape.size(), 3u);
        // [C, H / r, W / r] of the bucket the record names.
        const int64_t ratio =
            sf::model::AutoencoderDCConfig::named("dc-ae-tiny").spatial_compression_ratio();
        EXPECT_EQ(latent.shape[0],
                  sf::model::AutoencoderDCConfig::named("dc-ae-tiny").latent_channels);
        EXPECT_EQ(
            std::to_string(latent.shape[1] * ratio) + "x" + std::to_string(latent.shape[2] * ratio),
            r.metadata.at("bucket"));
        EXPECT_EQ(r.metadata.at("stage"), "encode_vae");
    });
    sf::storage::CacheReader texts(cache, "text");
    EXPECT_EQ(texts.count(),
              15u);  // 12 captions, the 2 of images decode rejects later, the empty prompt

    // Unchanged dataset: nothing decoded, no model loaded, nothing written.
    auto second = run_prep(o);
    EXPECT_EQ(second.written, 0);
    EXPECT_EQ(second.cached, 12);
    EXPECT_TRUE(second.models_loaded.empty());
    EXPECT_EQ(second.latents_written + second.texts_written, 0);

    // Three new images: only those are written. A renamed file keeps its key.
    write_dataset(tmp.path() / "data", 100, 3);
    std::filesystem::rename(tmp.file("data/img_1.jpg"), tmp.file("data/renamed_1.jpg"));
    std::filesystem::rename(tmp.file("data/img_1.txt"), tmp.file("data/renamed_1.txt"));
    auto third = run_prep(o);
    EXPECT_EQ(third.written, 3);
    EXPECT_EQ(third.latents_written, 3);
    EXPECT_EQ(third.texts_written, 3);
    EXPECT_EQ(third.cached, 12);
    EXPECT_EQ(samples_in(o.cache_dir), 15);

    // An edited caption is a new sample with a new text record; its latent is reused.
    sf::test::write_file(tmp.path() / "data" / "img_2.txt", "an edited caption");
    auto edited = run_prep(o);
    EXPECT_EQ(edited.written, 1);
    EXPECT_EQ(edited.texts_written, 1);
    EXPECT_EQ(edited.latents_written, 0);
    EXPECT_EQ(edited.models_loaded, std::vector<std::string>{"encode_text"});

    // Identical captions share one text record.
    write_image(tmp.path() / "data", 200, "a shared caption");
    write_image(tmp.path() / "data", 201, "a shared caption");
    auto shared = run_prep(o);
    EXPECT_EQ(shared.written, 2);
    EXPECT_EQ(shared.texts_written, 1);

    auto inspect = sf::pipelines::inspect_cache(o.cache_dir, /*verify=*/true);
    EXPECT_TRUE(inspect.ok);
    EXPECT_NE(inspect.text.find("verify: "), std::string::npos);
    EXPECT_NE(inspect.text.find("0 corrupt"), std::string::npos) << inspect.text;
    for (const char* stage : {"decode_image", "encode_text", "encode_vae"}) {
        EXPECT_NE(inspect.text.find(std::string("  ") + stage + " "), std::string::npos)
            << stage << inspect.text;
    }
}

TEST(PrepIntegration, ChangedFingerprintIsRefusedUnlessRebuilt) {
    TempDir tmp("sf_prep");
    write_dataset(tmp.path() / "data", 0, 4);
    PrepOptions o = options_for(tmp);
    EXPECT_EQ(run_prep(o).written, 4);

    o.resolution = 1024;
    o.min_side = 128;
    try {
        run_prep(o);
        FAIL() << "a cache made at 512 px must be refused at 1024 px";
    } catch (const sf::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("resolution"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--rebuild"), std::string::npos) << msg;
    }
    EXPECT_EQ(samples_in(o.cache_dir), 4);  // refusing touched nothing

    // Other encoder weights (here: another seed of the built-in models) are refused too, naming
    // the weights; --rebuild then redoes only the stages whose fingerprint changed.
    PrepOptions other_weights = options_for(tmp);
    other_weights.seed = 7;
    try {
        run_prep(other_weights);
        FAIL() << "latents made by other VAE weights must be refused";
    } catch (const sf::Error& e) {
        EXPECT_NE(std::string(e.what()).find("weights"), std::string::npos) << e.what();
    }
    other_weights.rebuild = true;
    auto reweighted = run_prep(other_weights);
    EXPECT_EQ(reweighted.written, 4);  // sample records name their latent and text keys
    EXPECT_EQ(reweighted.latents_written, 4);
    EXPECT_EQ(reweighted.texts_written, 4);

    o.rebuild = true;
    auto rebuilt = run_prep(o);
    EXPECT_EQ(rebuilt.written, 4);
    EXPECT_EQ(samples_in(o.cache_dir), 4);  // the 512-px records are gone, not kept beside
}

// No complex human instruction by default (upstream's script); "default" is Sana's, a file or a
// text is its own. Each is in the text stage's fingerprint, so a cache made with another is
// refused until --rebuild, and the caption features differ.
TEST(PrepIntegration, TheComplexHumanInstructionIsOffByDefaultAndFingerprinted) {
    TempDir tmp("sf_prep_chi");
    write_dataset(tmp.path() / "data", 0, 2);
    PrepOptions o = options_for(tmp);
    o.vae = false;  // the text phase is what this is about
    auto instruction = [&] {
        return sf::storage::Cache::open(o.cache_dir)
            .fingerprints()
            .at(sf::storage::schema::kEncodeTextStage)
            .at("instruction");
    };
    EXPECT_EQ(run_prep(o).texts_written, 2);
    EXPECT_EQ(instruction(), "none");
    o.complex_human_instruction = "default";
    EXPECT_THROW(run_prep(o), sf::Error);  // another instruction: refused without --rebuild
    o.rebuild = true;
    EXPECT_EQ(run_prep(o).texts_written, 2);
    EXPECT_EQ(instruction(), "sana-default");
    sf::test::write_file(tmp.path() / "chi.txt", "Describe the image:\nUser Prompt: ");
    o.complex_human_instruction = tmp.file("chi.txt");
    EXPECT_EQ(run_prep(o).texts_written, 2);
    EXPECT_EQ(instruction().rfind("custom-", 0), 0u) << instruction();
    o.max_sequence_length = 5000;
    sf::test::expect_error([&] { run_prep(o); }, sf::ErrorCode::kInvalidArgument,
                           "--max_sequence_length must be in [1, 2048], got 5000");
}

TEST(PrepIntegration, KilledRunLeavesValidRecordsAndRerunCompletes) {
    TempDir tmp("sf_prep_kill");
    constexpr int kImages = 24;
    write_dataset(tmp.path() / "data", 0, kImages);
    const PrepOptions o = options_for(tmp);

    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Exec, so the child is a clean process with its own threads.
        ::execl(kSanaflow.c_str(), "sanaflow", "-q", "prep", "--instance_data_dir",
                o.instance_data_dir.c_str(), "--cache_dir", o.cache_dir.c_str(), "--resolution",
                "512", "--min_side", "128", "--dataloader_num_workers", "1", "--commit_batch", "2",
                "--vae_batch_size", "1", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    // Kill it once some batches are committed, well before the end.
    int64_t seen = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
        if (std::filesystem::exists(std::filesystem::path(o.cache_dir) / "data.mdb")) {
            try {
                seen = samples_in(o.cache_dir);
            } catch (const sf::Error&) {
                seen = 0;  // the child may not have created the db yet
            }
        }
        if (seen >= 4) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it could be killed";
    const int64_t committed = samples_in(o.cache_dir);
    ASSERT_GE(committed, 4);
    ASSERT_LT(committed, kImages);

    auto before = sf::pipelines::inspect_cache(o.cache_dir, /*verify=*/true);
    EXPECT_TRUE(before.ok) << before.text;

    auto rerun = run_prep(o);
    // Latents commit in their own batches: a sample committed before the kill has its latent,
    // or the rerun encodes it again; either way the rerun completes the set.
    EXPECT_LE(rerun.cached, committed);
    EXPECT_EQ(rerun.written, kImages - committed);
    EXPECT_EQ(samples_in(o.cache_dir), kImages);
    EXPECT_TRUE(sf::pipelines::inspect_cache(o.cache_dir, true).ok);
}

// The same images, captions and settings give the same bytes in every record db, whatever the
// timing of the decode workers: the VAE's batches are cut in source order, so the same images
// share a forward (a batch of another size may round differently, so the batch size is kept).
TEST(PrepIntegration, SameInputGivesTheSameCacheBytes) {
    TempDir tmp("sf_prep_determinism");
    write_dataset(tmp.path() / "data", 0, 10);
    PrepOptions a = options_for(tmp), b = options_for(tmp);
    a.cache_dir = tmp.file("cache_a");
    b.cache_dir = tmp.file("cache_b");
    b.workers = 1;  // other timing: with batches cut by arrival, other batch boundaries
    b.max_in_flight = 7;
    b.offload = true;  // the text encoder layer by layer: the same features
    run_prep(a);
    run_prep(b);
    for (const char* db : {"samples", "latents", "text", "manifest"}) {
        std::map<std::string, std::string> records_a, records_b;
        sf::storage::CacheReader(sf::storage::Cache::open(a.cache_dir), db)
            .for_each([&](std::string_view k, std::string_view v) {
                records_a[std::string(k)] = std::string(v);
            });
        sf::storage::CacheReader(sf::storage::Cache::open(b.cache_dir), db)
            .for_each([&](std::string_view k, std::string_view v) {
                records_b[std::string(k)] = std::string(v);
            });
        EXPECT_FALSE(records_a.empty()) << db;
        EXPECT_EQ(records_a.size(), records_b.size()) << db;
        for (const auto& [key, value] : records_a) {
            auto it = records_b.find(key);
            ASSERT_NE(it, records_b.end()) << db << ": " << key << " only in the first cache";
            if (it->second == value) continue;
            const auto ra = sf::storage::decode_record(value, key),
                       rb = sf::storage::decode_record(it->second, key);
            for (const auto& [name, t] : ra.tensors)
                EXPECT_TRUE(t == rb.tensors.at(name)) << db << "/" << key << " tensor " << name;
            EXPECT_TRUE(ra.metadata == rb.metadata) << db << "/" << key << " metadata";
        }
    }
}

// The program: help, bad flags and missing paths give one clear line and a non-zero exit.
TEST(PrepIntegration, ANonUtf8NameIsARejectAndAnEmptyDatasetLeavesTheManifest) {
    TempDir tmp("sf_prep_names");
    write_dataset(tmp.path() / "data", 0, 3);
    write_image(tmp.path() / "data", 3, "caption");
    std::filesystem::rename(tmp.path() / "data" / "img_3.png",
                            tmp.path() / "data" / "caf\xE9.png");  // Latin-1
    std::filesystem::rename(tmp.path() / "data" / "img_3.txt", tmp.path() / "data" / "caf\xE9.txt");
    const PrepOptions o = options_for(tmp);
    const auto report = run_prep(o);
    EXPECT_EQ(report.written, 3);
    EXPECT_EQ(report.rejected, 1);
    const auto rejects = sf::storage::Cache::open(o.cache_dir).rejects();
    ASSERT_EQ(rejects.size(), 1u);
    EXPECT_EQ(rejects[0].source, tmp.file("data") + "/caf\\xE9.png");
    EXPECT_EQ(rejects[0].reason, "file name is not valid UTF-8 (bytes shown as \\xNN)");
    const std::string manifest =
        *sf::storage::CacheReader(sf::storage::Cache::open(o.cache_dir), "manifest")
             .get_raw("samples");

    // An empty folder over a good cache: refused, the training list kept.
    std::filesystem::create_directories(tmp.path() / "empty");
    PrepOptions empty = o;
    empty.instance_data_dir = tmp.file("empty");
    sf::test::expect_error([&] { run_prep(empty); }, sf::ErrorCode::kInvalidArgument,
                           "prep: no usable sample in " + tmp.file("empty") +
                               " (0 found, 0 rejected; no image or video files found)");
    EXPECT_EQ(*sf::storage::CacheReader(sf::storage::Cache::open(o.cache_dir), "manifest")
                   .get_raw("samples"),
              manifest);
    // And through the program: non-zero, saying why.
    const auto cli =
        sf::test::run_command(kSanaflow + " prep --instance_data_dir " + tmp.file("empty") +
                              " --cache_dir " + o.cache_dir + " --resolution 512 --min_side 128");
    EXPECT_EQ(cli.exit_code, 2) << cli.output;
    EXPECT_NE(cli.output.find("no usable sample"), std::string::npos) << cli.output;
}

// A prep whose every file is rejected exits non-zero with the reasons counted (numbers aside) and
// an example of each; a prep with some rejects prints the same summary after its table.
TEST(Cli, AnAllRejectedPrepSaysWhyWithCountsPerReason) {
    TempDir tmp("sf_prep_rejects");
    const auto data = tmp.path() / "data";
    std::filesystem::create_directories(data);
    for (int i = 0; i < 3; ++i) {  // too small, each another size
        cv::Mat small(40 + i, 50 + i, CV_8UC3, cv::Scalar(10, 20, 30));
        ASSERT_TRUE(cv::imwrite((data / ("small_" + std::to_string(i) + ".png")).string(), small));
        sf::test::write_file(data / ("small_" + std::to_string(i) + ".txt"), "a small image");
    }
    for (int i = 0; i < 2; ++i) {  // not an image at all
        sf::test::write_file(data / ("junk_" + std::to_string(i) + ".jpg"), "not a jpeg");
        sf::test::write_file(data / ("junk_" + std::to_string(i) + ".txt"), "junk");
    }
    const std::string prep = kSanaflow + " prep --instance_data_dir " + data.string() +
                             " --cache_dir " + tmp.file("cache") + " --min_side 128";
    const auto all = sf::test::run_command(prep);
    EXPECT_EQ(all.exit_code, 2) << all.output;
    EXPECT_NE(all.output.find("no usable sample"), std::string::npos) << all.output;
    EXPECT_NE(all.output.find("  3 x ["), std::string::npos) << all.output;
    EXPECT_NE(all.output.find("  2 x ["), std::string::npos) << all.output;
    EXPECT_NE(all.output.find("(e.g. " + data.string() + "/small_"), std::string::npos)
        << all.output;
    EXPECT_NE(all.output.find("(e.g. " + data.string() + "/junk_"), std::string::npos)
        << all.output;

    sf::test::write_dataset(data, 0, 2);
    const auto some = sf::test::run_command(prep);
    EXPECT_EQ(some.exit_code, 0) << some.output;
    EXPECT_NE(some.output.find("rejects by reason:\n  3 x ["), std::string::npos) << some.output;
}

TEST(Cli, HelpAndErrors) {
    auto help = sf::test::run_command(kSanaflow + " --help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.output.find("prep"), std::string::npos);
    EXPECT_NE(help.output.find("inspect"), std::string::npos);

    auto prep_help = sf::test::run_command(kSanaflow + " prep --help");
    EXPECT_EQ(prep_help.exit_code, 0);
    EXPECT_NE(prep_help.output.find("--instance_data_dir"), std::string::npos);
    EXPECT_NE(prep_help.output.find("--cache_dir"), std::string::npos);

    auto bad_flag = sf::test::run_command(kSanaflow + " prep --no_such_flag 1 --cache_dir /tmp/x");
    EXPECT_NE(bad_flag.exit_code, 0);
    EXPECT_NE(bad_flag.output.find("no_such_flag"), std::string::npos) << bad_flag.output;

    auto missing = sf::test::run_command(
        kSanaflow + " prep --instance_data_dir /nonexistent/dir --cache_dir /tmp/x");
    EXPECT_NE(missing.exit_code, 0);
    EXPECT_NE(missing.output.find("/nonexistent/dir"), std::string::npos) << missing.output;

    auto bad_res = sf::test::run_command(
        kSanaflow + " prep --instance_data_dir /tmp --cache_dir /tmp/x --resolution 777");
    EXPECT_NE(bad_res.exit_code, 0);
    EXPECT_NE(bad_res.output.find("777"), std::string::npos) << bad_res.output;

    auto no_cache = sf::test::run_command(kSanaflow + " inspect /nonexistent/cache");
    EXPECT_NE(no_cache.exit_code, 0);
    EXPECT_NE(no_cache.output.find("/nonexistent/cache"), std::string::npos) << no_cache.output;

    auto no_command = sf::test::run_command(kSanaflow);
    EXPECT_NE(no_command.exit_code, 0);

    // Refused before the cache is touched, in the program's words, not LibTorch's.
    TempDir tmp("sf_cli_refusals");
    write_dataset(tmp.path() / "data", 0, 1);
    const std::string prep = kSanaflow + " prep --instance_data_dir " + tmp.file("data") +
                             " --resolution 512 --min_side 128 --cache_dir ";
    auto bad_device = sf::test::run_command(prep + tmp.file("c1") + " --device cuda:x");
    EXPECT_EQ(bad_device.exit_code, 2) << bad_device.output;
    EXPECT_NE(bad_device.output.find("--device"), std::string::npos) << bad_device.output;
    EXPECT_FALSE(std::filesystem::exists(tmp.path() / "c1"));
    if (!sf::mem::cuda_available()) {
        auto no_cuda = sf::test::run_command(prep + tmp.file("c2") + " --device cuda");
        EXPECT_EQ(no_cuda.exit_code, 2) << no_cuda.output;
        EXPECT_FALSE(std::filesystem::exists(tmp.path() / "c2"));
    }
    // fp16 on the CPU: LibTorch 1.13 has no float16 CPU convolution, 2.x has one. Either it
    // runs, or it is refused naming the flag; never a LibTorch error from inside a model.
    auto fp16 =
        sf::test::run_command(prep + tmp.file("c3") + " --device cpu --mixed_precision fp16");
    if (fp16.exit_code != 0) {
        EXPECT_EQ(fp16.exit_code, 2) << fp16.output;
        EXPECT_NE(fp16.output.find("--mixed_precision fp16: this LibTorch has no"),
                  std::string::npos)
            << fp16.output;
        EXPECT_FALSE(std::filesystem::exists(tmp.path() / "c3"));
    }
    // A file as the output directory.
    sf::test::write_file(tmp.path() / "file", "x");
    auto file_out = sf::test::run_command(kSanaflow + " train --cache_dir " + tmp.file("c3") +
                                          " --output_dir " + tmp.file("file"));
    EXPECT_EQ(file_out.exit_code, 2) << file_out.output;
    EXPECT_NE(file_out.output.find("--output_dir " + tmp.file("file") + " is a file"),
              std::string::npos)
        << file_out.output;
}

TEST(Cli, PrepThenInspectVerifyThroughTheProgram) {
    TempDir tmp("sf_cli");
    write_dataset(tmp.path() / "data", 0, 5);
    auto prep = sf::test::run_command(kSanaflow + " prep --instance_data_dir " + tmp.file("data") +
                                      " --cache_dir " + tmp.file("cache") +
                                      " --resolution 512 --min_side 128");
    ASSERT_EQ(prep.exit_code, 0) << prep.output;
    EXPECT_NE(prep.output.find("5 written"), std::string::npos) << prep.output;
    auto inspect = sf::test::run_command(kSanaflow + " inspect " + tmp.file("cache") + " --verify");
    EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
    EXPECT_NE(inspect.output.find("samples"), std::string::npos);
    EXPECT_NE(inspect.output.find("samples per bucket"), std::string::npos) << inspect.output;
    EXPECT_NE(inspect.output.find(", 0 corrupt"), std::string::npos) << inspect.output;

    // A damaged record: inspect --verify names it and exits with status 3.
    {
        auto cache = sf::storage::Cache::open(tmp.file("cache"));
        sf::storage::CacheReader latents(cache, "latents");
        const std::string key = latents.keys().front();
        std::string frame = *latents.get_raw(key);
        frame[frame.size() / 2] ^= 0x5a;
        sf::storage::CacheWriter writer(cache, "latents", 1);
        writer.put_raw(key, frame);
        writer.flush();
    }
    auto damaged = sf::test::run_command(kSanaflow + " inspect " + tmp.file("cache") + " --verify");
    EXPECT_EQ(damaged.exit_code, 3) << damaged.output;
    EXPECT_NE(damaged.output.find(", 1 corrupt"), std::string::npos) << damaged.output;
}

}  // namespace
