"""tests/conftest.py's rule for which builds a CPU run compiles: every value of every switch in
one build at least (and the builds named to keep), the full cross product on a GPU."""
import itertools

import conftest


def _values(cases):
    return {(i, v) for c in cases for i, v in enumerate(c)}


def test_cover_has_every_switch_value_and_the_kept_builds(monkeypatch):
    monkeypatch.setattr(conftest, "ALL_BUILDS", False)
    cases = list(itertools.product((64, 128), ("fp16", "bf16"), "abcdefg"))
    keep = lambda c: c[1] == "fp16" and c[2] == "d"  # noqa: E731 (a stage's own builds, say)
    chosen = [cases[i] for i in conftest.covering(cases, keep=keep)]
    assert _values(chosen) == _values(cases)
    assert {(64, "fp16", "d"), (128, "fp16", "d")} <= set(chosen)
    assert len(chosen) <= 8, chosen  # 7 schedules, not 28 builds
    # each head dim and dtype taken about as often as the other, not all on the first values
    for i in (0, 1):
        counts = [sum(c[i] == v for c in chosen) for v in {c[i] for c in cases}]
        assert max(counts) - min(counts) <= 2, chosen


def test_cover_opens_nested_switches(monkeypatch):
    """Tuples and dicts inside a case are switches of their own (tiles, options)."""
    monkeypatch.setattr(conftest, "ALL_BUILDS", False)
    cases = [(64, None, {}), (64, (128, 2, 2), {}), (128, (128, 3, 2), {"v": True}),
             (128, (160, 3, 2), {}), (64, None, {"v": True})]
    chosen = [cases[i] for i in conftest.covering(cases)]
    assert {t[0] for _, t, _ in chosen if t} >= {128, 160} and any(t and t[1] == 3 for _, t, _ in chosen)
    assert any(o.get("v") for _, _, o in chosen)


def test_gpu_or_all_builds_compiles_every_case(monkeypatch):
    monkeypatch.setattr(conftest, "ALL_BUILDS", True)
    cases = list(itertools.product((64, 128), ("fp16", "bf16")))
    assert conftest.covering(cases) == list(range(4))
    assert conftest.compile_subset(cases) == cases
