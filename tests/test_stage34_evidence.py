"""Offline checks of the evidence helpers the stage 3 and 4 notebooks use (lib.notebook's
issue-12 block), and that the GPU profile step asks ncu for the metrics they read."""
from pathlib import Path

import pytest

from lib import notebook as nb

ROOT = Path(__file__).resolve().parent.parent


def test_profile_step_records_the_warp_metrics():
    script = (ROOT / "scripts" / "gpu_session.sh").read_text()
    for metric in nb.NCU_WARP_METRICS.values():
        assert metric in script, f"scripts/gpu_session.sh does not ask ncu for {metric}"
    assert '--metrics "$SMEM_METRICS,$WARP_METRICS"' in script


def test_column_store_ways():
    # stage 3's P tile (LD_P = 32 + 8) is conflict-free; stage 4's at BLOCK_Q 64 (64 + 8) is
    # 2-way: the two lanes of a row land 4 banks apart, inside the 8 banks the 16 rows span
    assert nb.column_store_ways(32, 40) == 1
    assert nb.column_store_ways(64, 72) == 2
    assert nb.column_store_ways(64, 88) == 1


def test_profile_facts_read_the_recorded_reports():
    for stage in (3, 4):
        f = nb.profile_facts(stage)
        if f is None:  # no recorded report in this checkout
            continue
        assert 0 < f["achieved_occupancy"] <= f["theoretical_occupancy"] + 1
        assert f["issue_rate"] and 0 < f["issue_rate"] <= 1
        assert f["issued_per_scheduler"] > 0


def test_softmax_control_flow_counts():
    c3, c4 = nb.softmax_control_flow(3, 64), nb.softmax_control_flow(4, 64)
    assert c3["per_tile"] > 0 and c4["per_tile"] > 0
    assert c3["control_per_tile"] <= c3["per_tile"] and c4["control_per_tile"] <= c4["per_tile"]


def test_stage3_d128_keeps_six_blocks_per_sm():
    # 6 blocks of 64 threads per SM leave 168 registers a thread; a build that takes more runs
    # 4 blocks and was a third slower on the H100 (stages/stage3.cu, MIN_BLOCKS_PER_SM)
    import torch

    import stages
    for dtype in (torch.float16, torch.bfloat16):
        for compiled in stages.get(3).compile_for("sm_90a", dtype, 128).values():
            usage = next(iter(compiled.resource_usage().values()))
            assert usage["registers"] <= 168, usage


def test_shared_load_requests_count_ldmatrix():
    # stage 5 reads shared memory almost only with ldmatrix.x4: 4 wavefronts per request at
    # best. Counting only the other shared loads as requests gave hundreds per request.
    rep = nb.ncu_report(5)
    if rep is None or not rep["kernels"]:
        pytest.skip("no recorded ncu report of stage 5 in this checkout")
    c = rep["kernels"][0]["shared"]["loads"]
    if c is None or c["source"] != "ncu metrics":
        pytest.skip("stage 5's recorded report has no raw shared-memory counters")
    assert 1 <= c["wavefronts_per_request"] <= 8, c
