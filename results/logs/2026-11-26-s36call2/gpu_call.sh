#!/usr/bin/env bash
# GPU call 2 of session 36 (issue 21): Nsight Compute on stage 6 and SDPA's default side by side
# at two decode rows where stage 6 stays under SDPA in every launch call 1 tried: B64 H32/8
# Sk4096 D128 (bandwidth-bound, 0.976x) and B64 H32/8 Sk1024 D64 (0.948x): launch, occupancy,
# memory throughput and warp states of each kernel. Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
NCU=(ncu --profile-from-start off --clock-control none --set full --import-source no)
for shape in "64 32 8 1 4096 128" "64 32 8 1 1024 64"; do
  name=decode-$(echo $shape | tr ' ' '-')
  step ncu-$name 150 "${NCU[@]}" -o /tmp/$name python3 scripts/profile_pair.py $shape
  ncu -i /tmp/$name.ncu-rep --page details --print-details all > $OUT/logs/$name.txt 2>&1
  grep -E "^  [a-zA-Z_]|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Grid Size|Block Size|Registers Per|Achieved Occupancy|Theoretical Occ|Waves Per SM|Dynamic Shared|Stall Long|Stall Barrier|Stall Wait|Stall Long|Issued Warp|Block Limit" $OUT/logs/$name.txt | cut -c1-150
done
gzip -f $OUT/logs/*.txt
