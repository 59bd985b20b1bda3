"""What sanaflow writes, read by the libraries its users already have.

- A full fine-tune's transformer/ loads with diffusers' SanaTransformer2DModel.from_pretrained,
  and its forward equals sanaflow's on the same inputs.
- A LoRA file from `sanaflow train --rank` loads with the transformer's load_lora_adapter (peft),
  and the adapted forward equals sanaflow's adapted model's.
- The Wan VAE's tiled decode equals diffusers' AutoencoderKLWan.enable_tiling() decode.
- Validation's sampler equals diffusers' SanaPipeline (output_type="latent") run with the same
  transformer, prompt features, noise and scheduler: Sana's DPM-Solver++ 2M, UniPC and Euler.
- The cache reads with lmdb, zstandard, safetensors and xxhash exactly as docs/cache-format.md
  says: the document's own Python code is run here.

sanaflow's side of each forward is tests/ecosystem_forward.cpp, given the same files. Run by
ctest through tests/python/run_ecosystem.sh, which skips (saying so) without the project's .venv.
"""

import json
import os
import re
import subprocess
import tempfile
import unittest
from pathlib import Path

import lmdb
import safetensors.torch
import torch
import xxhash
import zstandard
from diffusers import SanaTransformer2DModel

SANAFLOW = os.environ["SANAFLOW"]
FORWARD = os.environ["SANAFLOW_ECOSYSTEM_FORWARD"]
SOURCE_DIR = Path(os.environ["SANAFLOW_SOURCE_DIR"])
# fp32 forward tolerances, as the golden tests use.
RTOL, ATOL = 1e-4, 1e-5
LORA = {"rank": "4", "alpha": "8", "targets": "to_q,to_k,to_v,to_out.0"}


def run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


class Ecosystem(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="sf_ecosystem_")
        root = Path(cls.tmp.name)
        cls.demo = root / "demo"
        run(SANAFLOW, "demo", "--output_dir", cls.demo, "--num_images", "8")
        cls.base = cls.demo / "train" / "transformer"  # the demo's full fine-tune
        cls.lora_dir = root / "lora"
        run(SANAFLOW, "train", "--cache_dir", cls.demo / "cache", "--output_dir", cls.lora_dir,
            "--pretrained_model_name_or_path", cls.demo / "train", "--rank", LORA["rank"],
            "--lora_alpha", LORA["alpha"], "--lora_target_modules", LORA["targets"],
            "--max_train_steps", "4", "--learning_rate", "1e-2", "--checkpointing_steps", "0")
        cls.inputs = root / "inputs.safetensors"
        config = json.loads((cls.base / "config.json").read_text())
        g = torch.Generator().manual_seed(0)
        mask = torch.ones(2, 7, dtype=torch.int64)
        mask[1, 4:] = 0  # a padded caption
        safetensors.torch.save_file({
            "hidden_states": torch.randn(2, config["in_channels"], 8, 8, generator=g),
            "encoder_hidden_states": torch.randn(2, 7, config["caption_channels"], generator=g),
            "timestep": torch.tensor([300.0, 750.0]),
            "encoder_attention_mask": mask,
        }, str(cls.inputs))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def sanaflow_forward(self, *lora_args):
        out = Path(self.tmp.name) / "ours.safetensors"
        run(FORWARD, self.base, self.inputs, out, *lora_args)
        return safetensors.torch.load_file(str(out))["sample"]

    def diffusers_forward(self, model):
        x = safetensors.torch.load_file(str(self.inputs))
        with torch.no_grad():
            return model(hidden_states=x["hidden_states"],
                         encoder_hidden_states=x["encoder_hidden_states"],
                         timestep=x["timestep"], encoder_attention_mask=x["encoder_attention_mask"],
                         return_dict=False)[0]

    def test_a_full_fine_tune_loads_in_diffusers_with_equal_outputs(self):
        model = SanaTransformer2DModel.from_pretrained(str(self.base)).eval()
        torch.testing.assert_close(self.diffusers_forward(model), self.sanaflow_forward(),
                                   rtol=RTOL, atol=ATOL)

    def test_a_lora_loads_with_peft_and_gives_the_same_adapted_outputs(self):
        lora_file = self.lora_dir / "pytorch_lora_weights.safetensors"
        model = SanaTransformer2DModel.from_pretrained(str(self.base)).eval()
        base_out = self.diffusers_forward(model)
        model.load_lora_adapter(str(self.lora_dir), weight_name=lora_file.name,
                                prefix="transformer")
        ours = self.sanaflow_forward(lora_file, LORA["rank"], LORA["alpha"], LORA["targets"])
        theirs = self.diffusers_forward(model)
        # The trained adapters matter, so an adapter that failed to load would be caught.
        self.assertGreater((theirs - base_out).abs().max().item(), 100 * ATOL)
        torch.testing.assert_close(theirs, ours, rtol=RTOL, atol=ATOL)

    def test_the_wan_vae_decodes_in_tiles_as_diffusers_does(self):
        from diffusers import AutoencoderKLWan
        vae_dir = SOURCE_DIR / "tests" / "data" / "golden-video" / "vae_wan"
        g = torch.Generator().manual_seed(1)
        config = json.loads((vae_dir / "config.json").read_text())
        latent = torch.randn(1, config["z_dim"], 2, 7, 9, generator=g)  # 56 x 72 px, 5 frames
        inputs = Path(self.tmp.name) / "wan_latent.safetensors"
        out = Path(self.tmp.name) / "wan_decoded.safetensors"
        safetensors.torch.save_file({"latent": latent}, str(inputs))
        # 32-px tiles at 24-px steps: a 3 x 3 grid, every seam blended.
        run(FORWARD, "--wan-decode", vae_dir, inputs, out, 32, 32, 24, 24)
        ours = safetensors.torch.load_file(str(out))["sample"]
        vae = AutoencoderKLWan.from_pretrained(str(vae_dir)).eval()
        vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
                          tile_sample_stride_height=24, tile_sample_stride_width=24)
        with torch.no_grad():
            theirs = vae.decode(latent, return_dict=False)[0]
            vae.disable_tiling()
            whole = vae.decode(latent, return_dict=False)[0]
        self.assertGreater((theirs - whole).abs().max().item(), 1e-2)  # the tiling mattered
        torch.testing.assert_close(ours, theirs, rtol=0, atol=5e-5)

    def test_validation_samples_as_sanas_pipeline_does(self):
        from diffusers import (DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler,
                               SanaPipeline, UniPCMultistepScheduler)
        model = SanaTransformer2DModel.from_pretrained(str(self.base)).eval()
        config = model.config
        g = torch.Generator().manual_seed(2)
        length, empty_length, dim = 7, 4, config["caption_channels"]
        caption = torch.randn(length, dim, generator=g)
        empty = torch.randn(empty_length, dim, generator=g)
        noise = torch.randn(1, config["in_channels"], 8, 8, generator=g)
        inputs = Path(self.tmp.name) / "sample_inputs.safetensors"
        safetensors.torch.save_file({"latents": noise, "caption": caption, "empty": empty},
                                    str(inputs))
        # Sana_1600M_1024px_diffusers' scheduler, and an Euler one.
        schedulers = {
            "dpm": DPMSolverMultistepScheduler(
                algorithm_type="dpmsolver++", prediction_type="flow_prediction",
                use_flow_sigmas=True, flow_shift=3.0, solver_order=2, final_sigmas_type="zero"),
            "euler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            # What diffusers' SANA-Video converter writes with --scheduler_type uni-pc.
            "unipc": UniPCMultistepScheduler(prediction_type="flow_prediction",
                                             use_flow_sigmas=True, flow_shift=3.0),
        }
        # The empty prompt padded to the caption's length, masked, as sanaflow batches the two.
        negative = torch.zeros(1, length, dim)
        negative[0, :empty_length] = empty
        negative_mask = torch.zeros(1, length, dtype=torch.int64)
        negative_mask[0, :empty_length] = 1
        results = {}
        for name, scheduler in schedulers.items():
            scheduler_dir = Path(self.tmp.name) / f"scheduler_{name}"
            scheduler.save_config(str(scheduler_dir))
            out = Path(self.tmp.name) / f"sample_{name}.safetensors"
            run(FORWARD, "--sample", self.base, inputs, out, 6, 4.5,
                scheduler_dir / "scheduler_config.json")
            ours = safetensors.torch.load_file(str(out))["sample"]
            pipe = SanaPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=model,
                                scheduler=scheduler)
            pipe.set_progress_bar_config(disable=True)
            with torch.no_grad():
                theirs = pipe(prompt_embeds=caption.unsqueeze(0),
                              prompt_attention_mask=torch.ones(1, length, dtype=torch.int64),
                              negative_prompt=None, negative_prompt_embeds=negative,
                              negative_prompt_attention_mask=negative_mask,
                              latents=noise.clone(), num_inference_steps=6, guidance_scale=4.5,
                              height=256, width=256, output_type="latent",
                              use_resolution_binning=False, return_dict=False)[0]
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4, msg=name)
            results[name] = theirs
        # The samplers end apart, so the scheduler config mattered.
        self.assertGreater((results["dpm"] - results["euler"]).abs().max().item(), 1e-2)
        self.assertGreater((results["dpm"] - results["unipc"]).abs().max().item(), 1e-2)

    def test_tensorboard_reads_every_step_of_the_metrics(self):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(str(self.lora_dir / "logs" / "sanaflow"))
        events.Reload()
        loss = events.Scalars("loss")
        lines = [json.loads(l) for l in (self.lora_dir / "metrics.jsonl").read_text().splitlines()]
        self.assertEqual([e.step for e in loss], [m["step"] for m in lines])
        for e, m in zip(loss, lines):
            self.assertAlmostEqual(e.value, m["loss"], places=5)
        self.assertIn("lr", events.Tags()["scalars"])
        self.assertIn("peak_memory_mib/backward", events.Tags()["scalars"])

    def test_the_cache_reads_as_the_format_document_says(self):
        doc = (SOURCE_DIR / "docs" / "cache-format.md").read_text()
        blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
        self.assertGreaterEqual(len(blocks), 2)
        ns = {}
        for block in blocks:
            exec(block, ns)  # the document's reader, and its content-key assertion
        cache = str(self.demo / "cache")

        env = lmdb.open(cache, readonly=True, max_dbs=64)
        with env.begin() as txn:
            fingerprints = {k.decode(): v for k, v in txn.cursor(db=env.open_db(b"fingerprints", txn=txn))}
        env.close()
        text_fp = xxhash.xxh3_128_hexdigest(fingerprints["encode_text"])

        keys_tensor, manifest_meta = ns["read_record"](cache, "manifest", "samples")
        manifest = bytes(keys_tensor["keys"]).decode().split("\n")[:-1]
        self.assertEqual(len(manifest), int(manifest_meta["count"]))
        self.assertGreater(len(manifest), 0)
        for key in manifest:
            tensors, meta = ns["read_record"](cache, "samples", key)
            h, w = (int(v) for v in meta["bucket"].split("x"))
            self.assertEqual(list(tensors["bucket_size"]), [h, w])
            latent, latent_meta = ns["read_record"](cache, "latents", meta["latent_key"])
            c, lh, lw = latent["latent"].shape
            self.assertEqual((h % lh, w % lw, h // lh), (0, 0, w // lw))
            self.assertEqual(latent_meta["bucket"], meta["bucket"])
            text, text_meta = ns["read_record"](cache, "text", meta["text_key"])
            self.assertEqual(text["prompt_embeds"].shape[0], int(text_meta["tokens"]))
            self.assertEqual(text_meta["fingerprint"], text_fp)
            # The text key is the content key of the caption under encode_text's fingerprint.
            self.assertEqual(meta["text_key"],
                             ns["content_key"](meta["caption"].encode(), {"text": text_fp}))

        # safetensors' own reader agrees with the document's, BF16 included.
        env = lmdb.open(cache, readonly=True, max_dbs=64)
        with env.begin() as txn:
            key, frame = next(iter(txn.cursor(db=env.open_db(b"latents", txn=txn))))
        env.close()
        plain = zstandard.ZstdDecompressor().decompress(frame)
        ours, _ = ns["decode_safetensors"](plain)
        theirs = safetensors.torch.load(plain)
        self.assertEqual(set(ours), set(theirs))
        for name, t in theirs.items():
            torch.testing.assert_close(torch.from_numpy(ours[name].copy()), t.float(), rtol=0, atol=0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
