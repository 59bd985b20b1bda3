#!/usr/bin/env bash
# Warm step time and peak memory of sanaflow's training step next to upstream diffusers' on the
# same LibTorch: memory_ablation from build-torch2/ (PyPI's torch 2.12.1) against
# tools/bench/upstream_step.py on the venv's torch 2.12.1, the same transformer (4 blocks of
# width 512), batch 4, captions of 300 tokens, the same thread count, one warm-up step and the
# median of --steps more. Each grid compares
#   baseline   fp32, nothing else, both sides
#   remedies   upstream's checkpointing + bf16 + micro-batches of one against sanaflow's `all`
#              (those three, chunked attention and feed-forward, fused backward)
# and prints time and memory ratios, sanaflow / upstream; the last line is
# ratio=<the worst time ratio> (below 1: sanaflow is faster on every row).
#
#   bash tools/bench/speed_vs_upstream.sh [--grids 32,64] [--threads 2] [--steps 3] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
grids=32,64
threads=2
steps=3
build=build-torch2
while [ $# -gt 0 ]; do
  case "$1" in
    --grids) grids="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *) echo "speed_vs_upstream: unknown flag $1 (known: --grids --threads --steps --build)" >&2; exit 2 ;;
  esac
done
ablation="$build/tools/bench/memory_ablation"
if [ ! -x "$ablation" ]; then
  echo "speed_vs_upstream: $ablation is missing: bash tools/build.sh${build/build-torch2/ --torch2}" >&2
  exit 2
fi

value() { sed -n "s/^$1=//p" | tail -1; }
worst=0
printf '%-6s %-9s %12s %12s %8s %12s %12s %8s\n' grid row "sanaflow s" "upstream s" time \
  "sanaflow GiB" "upstream GiB" memory
for grid in ${grids//,/ }; do
  for row in baseline remedies; do
    ours_variant=$([ "$row" = baseline ] && echo baseline || echo all)
    ours=$(SANAFLOW_THREADS=$threads OMP_NUM_THREADS=$threads "$ablation" --variant "$ours_variant" \
      --grid "$grid" --steps "$steps")
    theirs=$(OMP_NUM_THREADS=$threads tools/python.sh tools/bench/upstream_step.py --variant "$row" \
      --grid "$grid" --steps "$steps" --threads "$threads" 2>/dev/null)
    ours_s=$(value step_seconds <<<"$ours")
    theirs_s=$(value step_seconds <<<"$theirs")
    ours_b=$(value peak_rss_bytes <<<"$ours")
    theirs_b=$(value peak_rss_bytes <<<"$theirs")
    read -r time_ratio mem_ratio ours_g theirs_g < <(python3 -c "
print(f'{$ours_s / $theirs_s:.2f} {$ours_b / $theirs_b:.2f} {$ours_b / 2**30:.2f} {$theirs_b / 2**30:.2f}')")
    printf '%-6s %-9s %12s %12s %7sx %12s %12s %7sx\n' "$grid" "$row" "$ours_s" "$theirs_s" \
      "$time_ratio" "$ours_g" "$theirs_g" "$mem_ratio"
    worst=$(python3 -c "print(max($worst, $time_ratio))")
  done
done
echo "ratio=$worst"
