#!/usr/bin/env bash
# On a CPU machine with a package index: download the Python 3.12 x86-64 wheels that a bare GPU
# machine without one needs for scripts/gpu_session.sh, into .whl/ (or DIR), to carry along.
#   - numpy below 2.5: numba-cuda 0.30 fails at its first kernel on numpy 2.5;
#   - the notebook runner (nbval, ipykernel, nbclient, nbformat) and transformers (lib.hf).
# Packages such a machine already has (pytest and its plugins) are left out, and so are two
# optional ones worth 10 MB (debugpy, an ipykernel extra; hf_xet, a download accelerator), so
# that the wheels and the working tree stay within a 64 MiB transfer.
# Usage (repository root):  bash scripts/fetch_wheels.sh [DIR] [EXTRA_PACKAGE ...]
# Then on the GPU machine: python3 -m pip install -q --no-index --no-deps --no-compile \
#   --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
dir="${1:-.whl}"; shift || true
mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$dir" "numpy>=2,<2.5" nbval ipykernel nbclient nbformat "transformers>=4.45" "$@"
rm -f "$dir"/pytest-*.whl "$dir"/pluggy-*.whl "$dir"/iniconfig-*.whl "$dir"/packaging-*.whl \
      "$dir"/debugpy-*.whl "$dir"/hf_xet-*.whl
echo "$(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
