"""One training step of upstream's transformer, as diffusers' train_dreambooth_lora_sana.py runs it.

The Python side of tools/bench/speed_vs_upstream.sh: diffusers' SanaTransformer2DModel with the
memory ablation's configuration (tools/bench/bench_configs.h: 4 blocks of width 512, sana-600m's
block structure), full fine-tune with torch.optim.AdamW, flow-matching loss, gradient clipping at
1.0. Variants:

  baseline   fp32, no checkpointing, the whole batch in one micro-batch
  remedies   what the script offers: enable_gradient_checkpointing(), bf16 autocast (accelerate's
             --mixed_precision bf16), gradient accumulation over micro-batches of one
  mixed_precision, gradient_checkpointing, accumulation
             each of those three alone (memory_ablation's variants of the same names)

One warm-up step, then --steps steps; prints step_seconds=<median> and peak_rss_bytes=<n>.
--trace FILE writes torch.profiler's record of every operator of the run (warm-up included), as
memory_ablation --trace does, for tools/bench/trace_ops.py.

  tools/python.sh tools/bench/upstream_step.py --variant baseline --grid 32 [--threads 2]
"""

import argparse
import resource
import statistics
import time

import torch
from diffusers import SanaTransformer2DModel


def ablation_transformer():
    return SanaTransformer2DModel(
        in_channels=32,
        out_channels=32,
        num_attention_heads=16,
        attention_head_dim=32,
        num_layers=4,
        num_cross_attention_heads=8,
        cross_attention_head_dim=64,
        cross_attention_dim=512,
        caption_channels=2304,
        mlp_ratio=2.5,
        dropout=0.0,
        attention_bias=False,
        sample_size=32,
        patch_size=1,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        choices=["baseline", "remedies", "mixed_precision", "gradient_checkpointing", "accumulation"],
        required=True,
    )
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--caption_len", type=int, default=300)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--trace", help="write torch.profiler's trace of the run (Chrome format)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = ablation_transformer()
    model.train()
    remedies = args.variant == "remedies"
    bf16 = remedies or args.variant == "mixed_precision"
    if remedies or args.variant == "gradient_checkpointing":
        model.enable_gradient_checkpointing()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    latents = torch.randn(args.batch, 32, args.grid, args.grid)
    captions = torch.randn(args.batch, args.caption_len, 2304)
    mask = torch.ones(args.batch, args.caption_len, dtype=torch.long)
    micro = 1 if remedies or args.variant == "accumulation" else args.batch

    def step():
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, args.batch, micro):
            x = latents[start : start + micro]
            noise = torch.randn_like(x)
            sigmas = torch.rand(x.shape[0])
            s = sigmas.view(-1, 1, 1, 1)
            noisy = (1.0 - s) * x + s * noise
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                pred = model(
                    hidden_states=noisy,
                    encoder_hidden_states=captions[start : start + micro],
                    encoder_attention_mask=mask[start : start + micro],
                    timestep=sigmas * 1000.0,
                    return_dict=False,
                )[0]
            loss = torch.mean((pred.float() - (noise - x)) ** 2)
            (loss * x.shape[0] / args.batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    profiler = None
    if args.trace:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.start()
    step()  # warm-up: AdamW's state, first touch of every page
    times = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    if profiler is not None:
        profiler.stop()
        profiler.export_chrome_trace(args.trace)
    print(f"peak_rss_bytes={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}")
    print(f"step_seconds={statistics.median(times):.4f}")


if __name__ == "__main__":
    main()
