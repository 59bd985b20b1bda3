#!/usr/bin/env bash
# Installs every Debian package sanaflow needs and selects OpenBLAS for LibTorch's BLAS calls
# (Debian's libtorch otherwise falls back to the reference BLAS, ~40x slower), then the project's
# Python environment .venv from tools/python-requirements.txt (PyPI's LibTorch 2.x for the second
# build, diffusers and peft for the ecosystem tests; about 5 GB; SANAFLOW_SKIP_PYTHON=1 skips it).
# Safe to run twice: what is present is not fetched again. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache git clang clang-format python3-venv
  libtorch-dev libgloo-dev libopenblas0-openmp
  libtbb-dev liblmdb-dev lmdb-utils libzstd-dev libxxhash-dev
  libopencv-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg
  nlohmann-json3-dev libcli11-dev libfmt-dev libyaml-cpp-dev libsentencepiece-dev
  libgtest-dev libgmock-dev
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

arch_dir=/usr/lib/x86_64-linux-gnu
if [ -e "$arch_dir/openblas-openmp/libblas.so.3" ]; then
  "${sudo_cmd[@]}" update-alternatives --set "libblas.so.3-x86_64-linux-gnu" "$arch_dir/openblas-openmp/libblas.so.3" >/dev/null
  "${sudo_cmd[@]}" update-alternatives --set "liblapack.so.3-x86_64-linux-gnu" "$arch_dir/openblas-openmp/liblapack.so.3" >/dev/null
  echo "setup: BLAS -> OpenBLAS (OpenMP)"
fi

if [ "${SANAFLOW_SKIP_PYTHON:-0}" != 1 ]; then
  cd "$(dirname "$0")/.."
  requirements=tools/python-requirements.txt
  stamp=.venv/requirements.sha256
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing $requirements into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r "$requirements"
    echo "$want" > "$stamp"
  else
    echo "setup: .venv matches $requirements"
  fi
fi
