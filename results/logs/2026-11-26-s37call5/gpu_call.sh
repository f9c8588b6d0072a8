#!/usr/bin/env bash
# GPU call 5 of session 37 (issue 21): stage 6's half last tile (HALF_LAST_TILE, option
# half_last, off by default). Stage 6's tests (the consumer loop was restructured around it),
# compute-sanitizer on the half-tile builds, then scripts/half_tile_ab.py: the call as it is
# against the same call with the half last tile at the map's prefill rows (S <= 4096, bf16) and
# two odd lengths, SDPA in the same rounds. Logs only. Call 4 ran the same tests (263 passed,
# sanitizers clean) but one: an offline compile whose NVRTC log came back empty on the H100
# (lib/nvrtc.py now compiles once more then); this call runs that test again, then the A/B.
set -u
L=results/logs/2026-11-26-s37call5
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py -k "compiles or half_last"; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
if [ $tests_rc -eq 0 ]; then
  step half-tile 300 python3 scripts/half_tile_ab.py --out $OUT/logs/half_tile.json
  grep -E "^\[" $OUT/logs/half-tile.log | cut -c1-260; tail -1 $OUT/logs/half-tile.log
fi
