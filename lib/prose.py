"""Notebook prose that cites measured figures, rendered from the record (issue 47).

A sentence that quotes a number measured here is not typed in a markdown cell: a *prose cell*
renders it from `results/*.json`, so executing the notebook after a re-record rewrites it, and CI
(nbval, and tests/test_notebook_prose.py without a kernel) fails when the stored rendering is not
what the record gives. A prose cell is a code cell whose first line is PROSE_MARK; it may use what
earlier prose cells of its notebook defined, nothing from other cells (so that
`python -m lib.notebook --render-prose NB` can render prose cells alone, without a GPU):

    # NBVAL_CHECK_OUTPUT  (prose: rendered from the record)
    from lib.prose import say, x, us, record_name
    r = row(6, "long")
    say("At B4 H16 S8192 D128 stage 6 takes {t} ({s} SDPA's default) in {rec}.",
        t=us(r["us"]), s=x(r["sdpa_us"] / r["us"]), rec=record_name())

Typed figures stay only for quotes from papers and datasheets, in a sentence naming its source.
"""
from __future__ import annotations

import math
import re

from lib import results as R

PROSE_MARK = "# NBVAL_CHECK_OUTPUT  (prose: rendered from the record)"

_sink = None  # lib.notebook_run's renderer collects here instead of displaying


def say(template: str, /, **values) -> str:
    """Format `template` with `values` (str.format) and show it as Markdown; returns the text."""
    text = template.format(**values) if values else template
    if _sink is not None:
        _sink.append(text)
    else:
        from IPython.display import Markdown, display
        display(Markdown(text))
    return text


# -- formatting: one spelling of each kind of figure everywhere ------------------------------

def _num(v: float, digits: int | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if digits is None:
        digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f}"


def x(ratio: float, digits: int = 2) -> str:
    """A ratio: '1.08×'."""
    return _num(ratio, digits) + "×"


def us(t: float, digits: int | None = None) -> str:
    """A time in microseconds: '3,424 µs', '51.7 µs', '8.25 µs'."""
    return _num(t, digits) + " µs"


def tflops(v: float, digits: int = 0) -> str:
    return _num(v, digits) + " TFLOPS"


def pct(frac: float, digits: int = 0) -> str:
    """A fraction as a percentage: 0.893 → '89%'."""
    return _num(100 * frac, digits) + "%"


def span(values, fmt=x) -> str:
    """The range of `values` in one format, the unit written once: '1.34–1.44×', '276–474 TFLOPS'."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    lo, hi = fmt(min(vals)), fmt(max(vals))
    if lo == hi:
        return lo
    m, n = _NUMBER.match(lo), _NUMBER.match(hi)
    if m and n and lo[m.end():] == hi[n.end():]:
        return f"{m.group(0)}–{hi}"
    return f"{lo}–{hi}"


_NUMBER = re.compile(r"-?[\d,]+(?:\.\d+)?")


# -- the record --------------------------------------------------------------------------------

_cache: dict = {}


def record() -> dict:
    """The results file the notebooks read (lib.results.load), loaded once per process."""
    if "data" not in _cache:
        data = R.load()
        if data is None:
            raise FileNotFoundError("no results/*.json: prose cells render from a record")
        _cache["data"] = data
    return _cache["data"]


def gpu_short(name: str | None = None) -> str:
    """'H100' from 'NVIDIA H100 80GB HBM3' (the record's GPU by default)."""
    name = name or record()["env"]["gpu"]
    for word in name.replace("NVIDIA", "").split():
        if word[:1].isalpha() and any(c.isdigit() for c in word):
            return word
    return name


def record_name(entry: dict | None = None) -> str:
    """How prose names a record: 'the H100 record (commit 6afd723, 2026-11-27)'. `entry` is a
    part of the record with its own commit and date (a stage's rows, the backward's entry);
    default: the file's env."""
    env = record()["env"]
    entry = entry or env
    commit = str(entry.get("commit", env.get("commit", "?")))[:7]
    date = str(entry.get("date", env.get("date", "?")))[:10]
    return f"the {gpu_short(entry.get('gpu') or env['gpu'])} record (commit {commit}, {date})"


def log_of(entry: dict, name: str) -> str:
    """The path of the log `name` (a file name or pattern, e.g. "*gap.log") of the run that made
    `entry`, under the results/logs/ folder named by its date and commit
    (`results/logs/<date>-<commit>…/`), for prose that cites it; LookupError unless exactly one."""
    date, commit = str(entry.get("date", ""))[:10], str(entry.get("commit", ""))[:7]
    found = sorted({p for d in (R.ROOT / "results" / "logs").glob(f"{date}-{commit}*") for p in d.glob(f"**/{name}")})
    if len(found) != 1:
        raise LookupError(f"{len(found)} logs {name} under results/logs/{date}-{commit}*: {found}")
    return str(found[0].relative_to(R.ROOT))


# -- the benchmark rows every notebook cites (one set of look-ups for all of them) --------------

def shape_dims(name: str) -> tuple[int, int, int, int]:
    """(B, H, S, D) of a named standard shape ("latency", "throughput", "long")."""
    return next(s[1:] for s in R.STANDARD_SHAPES if s[0] == name)


def row(stage: int, shape: str = "throughput", causal: bool = False, dtype: str = "float16") -> dict:
    """The recorded benchmark row of `stage` at a named standard shape; a prose cell must fail
    loudly (LookupError) rather than render a sentence without its figure."""
    from lib.notebook_common import recorded_row
    r = recorded_row(stage, shape, causal, dtype)
    if r is None:
        raise LookupError(f"no recorded row of stage {stage} at {shape} ({dtype}, causal={causal})")
    return r


def vs_sdpa(r: dict, field: str = "sdpa_us") -> float:
    """A row's speed against SDPA as the recorded tables give it: SDPA's median time at the row's
    shape over every stage's row (each timed SDPA again) ÷ the row's time; `field`
    "sdpa_flash_us" for the FLASH_ATTENTION backend."""
    from lib.notebook_common import sdpa_median_of
    return sdpa_median_of(r, field) / r["us"]


def vs_own_sdpa(r: dict, field: str = "sdpa_us") -> float:
    """A row's speed against the SDPA timing of its own run (the row's own SDPA time)."""
    return r[field] / r["us"]


def launch_gap_agreement(shapes=("throughput", "long")) -> float:
    """The largest relative difference between the launch-gap record's two timings (the GPU held
    or not: scripts/launch_gap.py) over every call at `shapes`."""
    return max(abs(r["old_us"] / r["held_us"] - 1) for r in record()["launch_gap"]["rows"]
               if r["shape"] in shapes)
