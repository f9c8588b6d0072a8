"""scripts/shape_map.py --parts splits (issue 21) on the CPU: which shapes it takes from a
record, which configs it times at each, what fits its budget, and (with the GPU's parts
replaced) the table and the log it writes."""
import importlib.util
import json
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHAPE_KEYS = ("B", "H", "Hkv", "Sq", "Sk", "D")


@pytest.fixture(scope="module")
def sm():
    spec = importlib.util.spec_from_file_location("shape_map_splits", ROOT / "scripts" / "shape_map.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _dec(B, H, Hkv, Sq, Sk, D, us, sdpa_us, dtype="bfloat16", part="decode", causal=False):
    return {"part": part, "B": B, "H": H, "Hkv": Hkv, "Sq": Sq, "Sk": Sk, "D": D, "dtype": dtype,
            "causal": causal, "us": us, "sdpa_us": sdpa_us, "vs_sdpa": sdpa_us / us}


def _recorded_rows():
    path = ROOT / "results" / "nvidia-h100-80gb-hbm3.json"
    rec = json.loads(path.read_text()).get("shape_map") if path.exists() else None
    if not rec:
        pytest.skip("no recorded shape map")
    return rec["rows"]


# B1 H8/1 Sk4096 D64: the worst row (32 splits, in the block); Sk 300: 3 key tiles; Sk 100: one;
# B64 H32/8: work enough that the plan does not split; D128's 32 splits combine by the kernel
@pytest.mark.parametrize("shape", [(1, 8, 1, 1, 4096, 64), (1, 8, 1, 1, 300, 64), (1, 8, 1, 1, 100, 128),
                                   (64, 32, 8, 1, 1024, 128), (1, 8, 1, 1, 4096, 128), (1, 8, 1, 4, 32768, 64)])
def test_split_variants(sm, shape):
    s6 = sm.s6
    ch = s6.choose(*shape, False, 132, blocks_per_sm=1)  # as the experiment ran: one block per SM
    key_tiles = -(-shape[4] // ch["tiles"][0])
    variants = sm.split_variants(*shape, sms=132)
    as_is = [(f, o) for f, o in variants if f["as_is"]]
    assert len(as_is) == 1 and as_is[0][1] == {"blocks_per_sm": 1}  # stage 6 called as is, once
    plan = [(f, o) for f, o in variants if f["plan"]]
    assert len(plan) == 1 and plan[0][1]["splits"] == ch["splits"] == plan[0][0]["plan_splits"]  # its explicit twin
    assert plan[0][0]["combine"] == as_is[0][0]["combine"] == plan[0][0]["plan_combine"]
    configs = set()
    for f, o in variants[1:]:
        n = o["splits"]
        assert 1 <= n <= key_tiles and s6.choose(*shape, False, 132, splits=n, blocks_per_sm=1)["splits"] == n
        if n == 1:
            assert "combine_in_block" not in o and f["combine"] == "none"
        else:
            assert o["combine_in_block"] == (f["combine"] == "in block")
        configs.add((n, f["combine"]))
    assert len(configs) == len(variants) - 1  # nothing timed twice
    counts = {n for n, _ in configs}
    assert counts == {n for n in (*sm.SPLIT_COUNTS, ch["splits"]) if n <= key_tiles}
    assert {c for n, c in configs if n > 1} <= {"in block", "kernel"}
    assert all((n, "in block") in configs and (n, "kernel") in configs for n in counts - {1})


def test_worst_rows_plan_and_combine(sm):
    """The worst row and its D128 twin: 32 splits each, and since the splits experiment
    (COMBINE_IN_BLOCK_BYTES 16 KB) the combine by the kernel at both (64 KB and 128 KB)."""
    assert sm.split_variants(1, 8, 1, 1, 4096, 64)[0][0] == {
        "variant": "stage 6's choice", "combine": "kernel", "plan": False, "as_is": True,
        "plan_splits": 32, "plan_combine": "kernel"}
    assert sm.split_variants(1, 8, 1, 1, 4096, 128)[0][0]["plan_combine"] == "kernel"


def test_split_shapes_from_a_record(sm):
    rows = [_dec(1, 8, 1, 1, 4096, 64, 13.4, 10.4), _dec(8, 8, 1, 1, 1024, 64, 12.0, 10.2),
            _dec(1, 8, 1, 1, 4096, 128, 12.2, 11.9),
            _dec(1, 32, 8, 1, 1024, 64, 11.0, 11.3),                      # above, in block 8 KB
            _dec(1, 32, 8, 1, 4096, 64, 14.0, 14.6),                      # above, in block 16 KB
            _dec(1, 32, 8, 1, 1024, 128, 10.0, 10.5),                     # above, in block 16 KB
            _dec(1, 32, 8, 4, 4096, 64, 18.2, 41.8),                      # above, by the kernel (64 KB)
            _dec(64, 32, 8, 4, 1024, 128, 108.6, 220.2),                  # above, unsplit: no control
            _dec(1, 8, 1, 1, 1024, 64, 10.8, 10.3, dtype="float16"),      # another dtype
            _dec(1, 8, 1, 1, 2048, 64, 10.8, 10.3, part="waterfall"),     # another part
            _dec(1, 8, 1, 1, 512, 64, 12.0, 10.0, causal=True)]           # causal: not split
    got = sm.split_shapes(rows, ["bfloat16"], controls=4)
    shapes = [tuple(r[k] for k in SHAPE_KEYS) for r in got]
    assert shapes[:3] == [(1, 8, 1, 1, 4096, 64), (8, 8, 1, 1, 1024, 64), (1, 8, 1, 1, 4096, 128)]  # worst first
    assert not any(r["control"] for r in got[:3]) and all(r["control"] for r in got[3:])
    # controls, two per head dim, the most bytes combined in the block first
    assert shapes[3:] == [(1, 32, 8, 1, 4096, 64), (1, 32, 8, 1, 1024, 64), (1, 32, 8, 1, 1024, 128)]
    assert got[0]["part"] == "splits" and got[0]["recorded_vs_sdpa"] == pytest.approx(10.4 / 13.4)
    assert sm.split_shapes(rows, ["bfloat16"], controls=2)[3:] == [got[3], got[5]]
    assert [r["dtype"] for r in sm.split_shapes(rows, ["float16"], controls=0)] == ["float16"]


def test_split_shapes_from_the_record(sm):
    """The recorded map's decode rows below SDPA are exactly the part's non-control shapes."""
    recorded = _recorded_rows()
    below = {tuple(r[k] for k in SHAPE_KEYS) for r in recorded
             if r["part"] == "decode" and r["dtype"] == "bfloat16" and r["vs_sdpa"] < 1.0}
    got = sm.split_shapes(recorded, ["bfloat16"])
    assert below and {tuple(r[k] for k in SHAPE_KEYS) for r in got if not r["control"]} == below
    assert [r["recorded_vs_sdpa"] for r in got if not r["control"]] == sorted(
        r["recorded_vs_sdpa"] for r in got if not r["control"])
    assert sum(r["control"] for r in got) == sm.SPLIT_CONTROLS
    assert all(r["recorded_vs_sdpa"] >= 1.0 for r in got if r["control"])


def test_splits_plan_respects_the_budget(sm):
    shapes = sm.split_shapes(_recorded_rows(), ["bfloat16"])
    everything = sm.splits_plan(shapes, budget_s=1e9)
    assert not everything["left_out"] and len(everything["shapes"]) == len(shapes)
    assert everything["configs"] == sum(len(v) for _, v, _ in everything["shapes"])
    default = sm.splits_plan(shapes)  # the default budget: about 4 minutes
    assert default["estimate_s"] <= 240 and default["shapes"][0][0] == shapes[0]
    assert default["estimate_s"] == pytest.approx(
        everything["estimate_s"] - sum(sm.split_cost_s(r, sm.split_variants(*(r[k] for k in SHAPE_KEYS)))
                                       for r in default["left_out"]))
    # budgets under the whole plan's estimate (the rows below SDPA, and so the plan, shrink as
    # stage 6 gets faster: 137 s at the map of a67c58f, 65 s at f42f426's)
    # the controls' cost is set aside first: with room for the start-up, the builds and the
    # controls, every control is taken
    setup = sm.SPLIT_COST["startup"] + sm.SPLIT_COST["compile"] * 2 * len({(r["D"], r["dtype"]) for r in shapes})
    room_for_controls = setup + sum(sm.split_cost_s(r, sm.split_variants(*(r[k] for k in SHAPE_KEYS)))
                                    for r in shapes if r["control"])
    budgets = sorted({40, min(80, everything["estimate_s"] - 5), min(150, everything["estimate_s"] - 1)})
    assert any(b >= room_for_controls for b in budgets)  # the check below runs at least once
    for budget in budgets:
        p = sm.splits_plan(shapes, budget_s=budget)
        assert p["estimate_s"] <= budget and p["left_out"]
        assert len(p["shapes"]) + len(p["left_out"]) == len(shapes)
        taken = [r for r, _, _ in p["shapes"]]
        assert [r for r in shapes if any(r is t for t in taken)] == taken  # in their order
        if budget >= room_for_controls:
            assert sum(r["control"] for r in taken) == sm.SPLIT_CONTROLS
        # the shapes are taken in their order while they fit: a shape left out is never followed
        # by a taken one (not a control, whose cost was set aside) that costs as much or more
        cost = {id(r): sm.split_cost_s(r, sm.split_variants(*(r[k] for k in SHAPE_KEYS))) for r in shapes}
        for i, r in enumerate(shapes):
            if any(r is x for x in p["left_out"]) and not r["control"]:
                assert not any(cost[id(t)] >= cost[id(r)] for t in shapes[i + 1:]
                               if not t["control"] and any(t is x for x in taken)), (r, budget)
    assert sm.splits_plan(shapes, budget_s=10)["shapes"] == []  # not even the start-up fits


def _fake_gpu(sm, monkeypatch, tmp_path, us_of):
    """scripts/shape_map.py's GPU calls replaced: stage 6's time comes from us_of(options)."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: SimpleNamespace(multi_processor_count=132, name="Fake GPU"))
    monkeypatch.setattr(sm.R, "capture_env", lambda: {"gpu": "Fake GPU", "commit": "abc"})
    monkeypatch.setattr(sm, "make_qkv", lambda *a, **k: ("q", "k", "v"))
    monkeypatch.setattr(sm, "_check", lambda fn, q, k, v, causal: SimpleNamespace(passed=True, max_abs_err=0.0))
    monkeypatch.setattr(sm, "sdpa_call", lambda *a, backend="default", **k: backend)
    timed = []

    def time_interleaved(fns, budget_s):
        timed.append(list(fns))
        out = {}
        for name, fn in fns.items():
            us = us_of(fn.keywords) if isinstance(fn, partial) else {"default": 10.0, "flash": 12.0}[fn]
            out[name] = SimpleNamespace(median_us=us, round_medians_us=[us] * 5)
        return out
    monkeypatch.setattr(sm, "time_interleaved", time_interleaved)
    return timed


def test_splits_part_end_to_end_without_a_gpu(sm, monkeypatch, tmp_path, capsys):
    """--parts splits --quick with the measurements faked: each shape's configs and both SDPA
    backends go into one time_interleaved call; the table marks the fastest and the plan's
    config; --out holds every row."""
    record = tmp_path / "rec.json"
    record.write_text(json.dumps({"shape_map": {"rows": [
        _dec(1, 8, 1, 1, 4096, 64, 13.4, 10.4), _dec(1, 32, 8, 1, 4096, 64, 14.0, 14.6)]}}))
    # 8 splits with the combine kernel fastest; the call as is (no options) as slow as its twin
    timed = _fake_gpu(sm, monkeypatch, tmp_path, lambda kw: 9.0 if (kw.get("splits"), kw.get(
        "combine_in_block")) == (8, False) else 13.0 + kw.get("splits", 32) / 100)
    out = tmp_path / "log" / "splits.json"
    monkeypatch.setattr(sys, "argv", ["shape_map.py", "--parts", "splits", "--quick", "--dtype", "bfloat16",
                                      "--splits-record", str(record), "--out", str(out)])
    assert sm.main() == 0
    text = capsys.readouterr().out
    assert "splits: 2 shapes from" in text and "rec.json" in text and "estimated" in text
    worst = sm.split_variants(1, 8, 1, 1, 4096, 64)
    assert len(timed) == 2 and timed[0] == [f"stage{i}" for i in range(len(worst))] + ["sdpa", "flash"]
    log = json.loads(out.read_text())
    rows = log["rows"]
    assert log["env"]["gpu"] == "Fake GPU" and log["splits_plan"]["configs"] == len(rows)
    assert len(rows) == len(worst) + len(sm.split_variants(1, 32, 8, 1, 4096, 64))
    assert all(r["part"] == "splits" and r["passed"] and r["sdpa_us"] == 10.0 for r in rows)
    table = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert table[0].startswith("| shape | splits | combine | µs | SDPA µs | ratio |")
    best = [ln for ln in table if "**best**" in ln]
    assert len(best) == 2 and "| 8 | kernel | 9.0 | 10.0 | 1.11× |" in best[0]
    assert [ln for ln in table if "plan" in ln][0].split("|")[2:4] == [" 32 ", " kernel "]
    assert "B1 H8/1 Sq1 Sk4096 D64 bfloat16: best 8 kernel 9.0 µs (1.11×), as called 32 kernel" in text
    assert "in block − kernel at 32 splits +0.0 µs" in text


def test_splits_part_refuses_without_a_record(sm, monkeypatch, tmp_path):
    """No recorded shape map to pick the decode rows from: a clear refusal, nothing measured."""
    _fake_gpu(sm, monkeypatch, tmp_path, lambda kw: 10.0)
    monkeypatch.setattr(sys, "argv", ["shape_map.py", "--parts", "splits", "--quick", "--dtype", "bfloat16",
                                      "--splits-record", str(tmp_path / "none.json"), "--budget-s", "30"])
    with pytest.raises(SystemExit, match="no recorded decode rows of"):
        sm.main()
