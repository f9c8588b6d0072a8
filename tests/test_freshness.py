"""The recorded GPU results must describe the kernels in this tree: editing a stage's sources
without re-recording on a GPU (python -m lib.bench --record) fails here."""
import stages
from lib import results


def test_recorded_results_match_current_sources():
    data = results.load()
    assert data is not None, "no results/*.json: run `python -m lib.bench --record` on a GPU"
    problems = results.stale_stages(data, stages.all_stages())
    assert not problems, "\n".join(problems)


def test_recorded_results_carry_provenance():
    data = results.load()
    assert data is not None
    for key in ("gpu", "sm_count", "driver", "cuda", "torch", "numba_cuda", "nvrtc", "commit",
                "date"):
        assert data["env"].get(key) not in (None, ""), key
    assert data["runs"], "no rows recorded"
    for r in data["runs"]:
        assert r["skipped"] if r.get("skipped") else (r["us"] > 0 and r["passed"]), r
