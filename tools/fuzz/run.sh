#!/usr/bin/env bash
# Builds the libFuzzer targets (tools/fuzz/CMakeLists.txt, clang with ASan and UBSan) and runs
# each on a corpus seeded by the program's own writers:
#
#   bash tools/fuzz/run.sh                 every target for 30 s (CI runs 15 s: tools/test.sh --fuzz)
#   bash tools/fuzz/run.sh --seconds 600   longer
#   bash tools/fuzz/run.sh --runs 10000000 record index     a number of executions, some targets
#   nice bash tools/fuzz/run.sh --timeout 120 --runs 10000000 yaml   a long run beside other work
#                                           (one input slower than --timeout, default 20 s, is a finding)
#
# Prints one line per target with its executions; a crash, leak or sanitizer report stops with
# the input saved under build-fuzz/findings/ and a non-zero exit. Corpora grow across runs in
# build-fuzz/corpus/.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=30
runs=0
timeout=20
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(record safetensors safetensors_file index config state yaml image_header)
everything=0
[ ${#targets[@]} -gt 0 ] || { targets=("${all[@]}"); everything=1; }

command -v clang++ >/dev/null || { echo "run.sh: clang++ not found (bash tools/setup.sh)" >&2; exit 2; }
cmake -S tools/fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j"$(nproc)" >/dev/null
build-fuzz/make_seeds build-fuzz/seeds . >/dev/null
# The clip reader only where FFmpeg's libraries were found (tools/fuzz/CMakeLists.txt).
if [ -x build-fuzz/fuzz_clip ]; then
  all+=(clip)
  [ "$everything" = 1 ] && targets+=(clip)
  # Tiny clips, one per container and codec the stage is tested with; none without ffmpeg.
  mkdir -p build-fuzz/seeds/clip
  if command -v ffmpeg >/dev/null && [ ! -e build-fuzz/seeds/clip/h264.mp4 ]; then
    src=(-f lavfi -i testsrc=size=32x24:rate=8 -t 0.5)
    ffmpeg -v error -y "${src[@]}" -c:v libx264 -pix_fmt yuv420p build-fuzz/seeds/clip/h264.mp4
    ffmpeg -v error -y "${src[@]}" -c:v libvpx-vp9 build-fuzz/seeds/clip/vp9.webm
    ffmpeg -v error -y "${src[@]}" -c:v mpeg4 build-fuzz/seeds/clip/mpeg4.avi
    ffmpeg -v error -y "${src[@]}" -c:v png -pix_fmt pal8 build-fuzz/seeds/clip/pal8.mkv
    ffmpeg -v error -y -i build-fuzz/seeds/clip/h264.mp4 -c copy -metadata:s:v rotate=90 \
      build-fuzz/seeds/clip/rotated.mp4
  fi
fi
mkdir -p build-fuzz/findings
# No allocation stacks: ASan's stack depot grows with every new one (a long run of the recursive
# yaml reader spent 26% of its time storing them; 4202 against 3498 executions/s over 40 s).
# A finding's full report comes from rerunning it alone:
# ASAN_OPTIONS= build-fuzz/fuzz_<target> build-fuzz/findings/<file>
export ASAN_OPTIONS="${ASAN_OPTIONS-malloc_context_size=0}"

status=0
for t in "${targets[@]}"; do
  [ -x "build-fuzz/fuzz_$t" ] || { echo "run.sh: no target '$t' (have: ${all[*]})" >&2; exit 2; }
  mkdir -p "build-fuzz/corpus/$t"
  limit=(-max_total_time="$seconds")
  [ "$runs" -gt 0 ] && limit=(-runs="$runs")
  log="build-fuzz/fuzz_$t.log"
  # Text formats need no more than a few KiB to reach every branch (the JSON nesting limit is 64
  # levels); binary ones get room for a tensor.
  case "$t" in
    config|state|yaml|index) max_len=4096 ;;
    safetensors|safetensors_file) max_len=16384 ;;
    *) max_len=65536 ;;
  esac
  if "build-fuzz/fuzz_$t" "build-fuzz/corpus/$t" "build-fuzz/seeds/$t" "${limit[@]}" \
      -max_len="$max_len" -rss_limit_mb=2048 -timeout="$timeout" -print_final_stats=1 \
      -artifact_prefix="build-fuzz/findings/$t-" >"$log" 2>&1; then
    result=ok
  else
    result="FINDING (see $log and build-fuzz/findings/)"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  printf 'fuzz %-18s %12s executions  %s\n' "$t" "$execs" "$result"
done
exit $status
