"""The training map (issue 48, item 5: scripts/backward_bench.py --train-step) on the CPU: its
shapes are the shape map's prefill grid, a row says passed only when every gradient check held,
a step does not add into the last step's gradients, the record goes under "train_step" only when
every row passed, and the notebook's plot says when there is no map yet. The measurement itself
needs an sm_90 GPU and is a stand-in here."""
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_for_train_map", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _script("backward_bench")


def test_shapes_are_the_shape_maps_prefill_grid(bench):
    shape_map = _script("shape_map")
    shapes = bench.train_shapes()
    assert len(shapes) == 6 * 2 * 2 * 2  # S × head dims × MHA/GQA × mask
    assert len({tuple(s.values()) for s in shapes}) == len(shapes)
    assert all(s["B"] * s["S"] == shape_map.TOKENS == 16384 for s in shapes)
    assert sorted({s["S"] for s in shapes}) == list(shape_map.PREFILL_SEQS)
    assert bench.TRAIN_HEADS == shape_map.PREFILL_HEADS  # the same heads per head dim as the map
    for s in shapes:
        assert s["H"] == bench.TRAIN_HEADS[s["D"]] and s["Hkv"] in (s["H"], s["H"] // 4)
        assert s["dtype"] == "bfloat16"
    for D in (64, 128):
        got = {(s["Hkv"] < s["H"], s["causal"]) for s in shapes if s["D"] == D}
        assert got == {(False, False), (False, True), (True, False), (True, True)}


def test_check_slice_holds_one_whole_group(bench):
    assert bench.check_heads(16, 4) == (4, 1) and bench.check_heads(32, 8) == (4, 1)
    assert bench.check_heads(16, 16) == (2, 2)


def _timing(us, rounds):
    return SimpleNamespace(median_us=us, round_medians_us=rounds)


def _checks(err, tol=1.0, fail=()):
    return {n: SimpleNamespace(max_abs_err=err, tolerance=tol, passed=n not in fail) for n in ("dq", "dk", "dv")}


def test_row_passes_only_when_both_checks_held(bench):
    shape = {"B": 8, "H": 16, "Hkv": 4, "S": 2048, "D": 64, "causal": True, "dtype": "bfloat16"}
    row = bench.train_row(shape, _timing(200.0, [199, 200, 201]), _timing(150.0, [150, 150, 151]),
                          _checks(0.1, 1.0), _checks(0.3, 0.8))
    for key in ("B", "H", "Hkv", "S", "D", "causal", "dtype", "us", "sdpa_us", "passed"):
        assert key in row
    assert row["us"] == 200.0 and row["sdpa_us"] == 150.0 and row["vs_sdpa"] == pytest.approx(0.75)
    assert row["round_medians_us"] == [199, 200, 201] and row["sdpa_round_medians_us"] == [150, 150, 151]
    assert row["max_grad_err"] == {"dq": 0.3, "dk": 0.3, "dv": 0.3}
    assert row["grad_tolerance"] == {"dq": 0.8, "dk": 0.8, "dv": 0.8}
    assert row["passed"] is True
    # a check that failed after timing fails the row; SDPA missing leaves no ratio
    row = bench.train_row(shape, _timing(200.0, [200]), None, _checks(0.1), _checks(0.1, fail=("dk",)))
    assert row["passed"] is False and row["sdpa_us"] is None and row["vs_sdpa"] is None
    # a step is 3.5 forwards: 2 + 5 products
    from lib.reference import attention_flops
    assert row["tflops"] == pytest.approx(3.5 * attention_flops(8, 16, 2048, 2048, 64, True) / 200.0 / 1e6)


def test_a_step_does_not_add_into_the_last_ones_gradients(bench):
    q, k, v = (torch.randn(1, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :1], v[:, :1]
    dout = torch.randn_like(q)
    x = bench.leaves(q, k, v)
    fwd = lambda: torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=True)  # noqa: E731
    step = bench.train_step_call(fwd, x, dout)
    step()
    first = [t.grad.clone() for t in x]
    step()
    for g, t in zip(first, x):
        assert torch.equal(g, t.grad)
    assert x[0] is not q and not q.requires_grad  # the timed leaves are copies


@pytest.fixture
def fake_gpu(bench, tmp_path, monkeypatch):
    from lib import results as R
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(R, "capture_env", lambda: {"gpu": "Fake GPU", "commit": "abc1234", "date": "d"})
    monkeypatch.setattr(bench, "HAS_GPU", True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    measured = []

    def measure(shape):
        measured.append(shape)
        return bench.train_row(shape, _timing(100.0, [100.0]), _timing(90.0, [90.0]), _checks(0.1), _checks(0.1))
    monkeypatch.setattr(bench, "measure_train_row", measure)
    monkeypatch.setattr(sys, "argv", ["backward_bench.py", "--train-step", "--record"])
    return tmp_path / "fake-gpu.json", measured


def test_records_the_map_under_train_step(bench, fake_gpu):
    from lib import results as R
    path, measured = fake_gpu
    assert bench.main() == 0
    entry = json.loads(path.read_text())["train_step"]
    assert len(entry["rows"]) == len(measured) == len(bench.train_shapes())
    assert entry["env"]["gpu"] == "Fake GPU" and "hold=False" in entry["method"]
    assert entry["sha256"] == {"6": R.stage_sha256(bench.stage6.INFO), "8": R.stage_sha256(bench.stage8.INFO)}
    assert "backward" not in json.loads(path.read_text())  # the backward table was not run


def test_a_failed_check_records_nothing(bench, fake_gpu, monkeypatch):
    path, _ = fake_gpu
    monkeypatch.setattr(bench, "measure_train_row", lambda shape: bench.train_row(
        shape, _timing(100.0, [100.0]), _timing(90.0, [90.0]), _checks(0.1), _checks(2.0, fail=("dq",))))
    assert bench.main() == 1 and not path.exists()


def test_other_gpus_skip_and_say_so(bench, fake_gpu, monkeypatch, capsys):
    path, measured = fake_gpu
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert bench.main() == 0
    assert "sm_90" in capsys.readouterr().err and not measured and not path.exists()


def test_plot_says_when_there_is_no_map(bench, capsys):
    import matplotlib
    matplotlib.use("Agg")
    from lib.notebook_backward import plot_train_map
    assert plot_train_map({"env": {}}) is None and plot_train_map(None) is None
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "no training map recorded yet" in out[0] and "--train-step --record" in out[0]
    rows = [bench.train_row(s, _timing(100.0, [100.0]), _timing(100.0 * (1 + i % 3) / 2, [1.0]), _checks(0.1),
                            _checks(0.1)) for i, s in enumerate(bench.train_shapes())]
    fig = plot_train_map({"train_step": {"env": {"gpu": "NVIDIA H200", "commit": "abc1234", "date": "2026-11-29"},
                                         "sha256": {}, "rows": rows}})
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
    assert len(lines) == 8  # head dim × MHA/GQA × mask
    assert all(list(ln.get_xdata()) == sorted(ln.get_xdata()) for ln in lines)
    first = next(ln for ln in lines if ln.get_label() == "D64 H16/16 (MHA) full")
    assert list(first.get_ydata()) == pytest.approx([r["sdpa_us"] / r["us"] for r in rows
                                                     if r["D"] == 64 and r["Hkv"] == 16 and not r["causal"]])
    assert "NVIDIA H200" in ax.get_title() and "abc1234" in ax.get_title()
    assert any(list(ln.get_ydata()) == [1.0, 1.0] for ln in ax.get_lines())  # the line at 1


@pytest.mark.parametrize("D", [64, 128])
def test_waterfall_turns_one_switch_a_step(bench, monkeypatch, D):
    """The record's waterfall (the stage 8 notebook's bars): each build of PRODUCER_PATH is one of the
    timed variants, and each differs from the one before it in one switch of stage 8's defines (two
    where a step names two: the producer with a second warpgroup taking turns, KV_REGS with
    PREP_EARLY 3); the last is the stage's build."""
    import stages.stage8 as stage8
    monkeypatch.setattr(stage8, "wgmma_here", lambda: True)
    timed = dict(bench.variants(D, "wgmma"))
    path = bench.PRODUCER_PATH[D]
    assert all(label in timed for label in path), [label for label in path if label not in timed]

    def defines(label):
        kw = {k: v for k, v in timed[label].items() if k != "wgmma"}
        return dict(stage8.config(D, None, kw.pop("dq_atomics", None), 1, **kw)["defines"])
    steps = [defines(label) for label in path]
    assert steps[-1] == dict(stage8.config(D, wgmma=1)["defines"])
    for a, b, before, label in zip(steps, steps[1:], path, path[1:]):
        changed = {k for k in a if a[k] != b[k]}
        assert 1 <= len(changed) <= (2 if "turns" in label or before == bench.NO_KV_REGS_LABEL else 1), (label, changed)
