"""Notebooks that teach and cannot go stale (issue 47), checked without a kernel:
- prose cells (lib.prose) store what the record renders now (nbval checks the same in a kernel);
- markdown cells type no measured figure (µs, TFLOPS, GHz, GB/s, %, a decimal ratio ×) except in
  a sentence that names its source (a paper, a datasheet, a PR, a published table, or the log of
  a one-off experiment: results/logs/… or experiments/…) or one the notebook's metadata
  "prose_allow" lists;
- short: no markdown (or rendered prose) cell over 500 words, no notebook over 6,000;
- a record is named by commit, date and GPU, never by a work session or a GPU call;
- a notebook opens with what the reader will learn and closes with 3-6 takeaways."""
import json
import re
from pathlib import Path

import pytest

from lib.notebook_run import is_prose_cell, stale_prose, stored_markdown

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_CELL_WORDS, MAX_NOTEBOOK_WORDS = 500, 6000

FIGURE = re.compile(r"(?<![\w.])(?:\d[\d,]*(?:\.\d+)?\s*(?:µs|us\b|ms\b|TFLOPS|TFLOP/s|GHz|MHz|GB/s|TB/s|%)"
                    r"|\d+\.\d+\s*[×x](?![\w\d]))")
SOURCED = re.compile(r"paper|datasheet|PR #|whitepaper|published|PTX ISA|vendor|Fig\. ?\d|"
                     r"arXiv|blog|README of|spec sheet|results/logs/|experiments/", re.I)
# (a path is not prose: allowed; log folders are named by date, commit and GPU now, but a path in
# git history, `git show <commit>:results/logs/2026-11-27-s46call4/…`, keeps the name it had then)
SESSION = re.compile(r"\bsessions? \d+|(?<![-/\w])s\d+call\d+|\bGPU call \d+|\bcall \d+ of", re.I)


def _nb(path):
    return json.loads(path.read_text())


def _markdown(nb):
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]


def _prose(nb):
    return [(i, "\n".join(stored_markdown(c))) for i, c in enumerate(nb["cells"]) if is_prose_cell(c)]


def _strip_code(md: str) -> str:
    md = re.sub(r"```.*?```", " ", md, flags=re.S)
    md = re.sub(r"`[^`]*`", " ", md)
    return re.sub(r"\$[^$]*\$", " ", md)


def _sentences(md: str):
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(*])|\n\s*\n|\n(?=\s*[-*|#] )", md)


def typed_figures(md: str, allow=()) -> list[str]:
    """The measured-looking figures a markdown text types outside a sentence naming a source."""
    found = []
    for raw in _sentences(md):
        if SOURCED.search(raw):
            continue
        s = _strip_code(raw)
        for m in FIGURE.finditer(s):
            if not any(a in s for a in allow):
                found.append(f"{m.group(0)!r} in …{' '.join(s[max(0, m.start() - 80):m.end() + 40].split())}…")
    return found


def _words(text: str) -> int:
    return len(_strip_code(text).split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_cells_are_what_the_record_renders(path):
    stale = stale_prose(path)
    assert not stale, (f"prose rendered from an older record: {stale}; run "
                       f"`python -m lib.notebook --render-prose {path.relative_to(ROOT)}`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_types_no_measured_figure(path):
    nb = _nb(path)
    allow = nb.get("metadata", {}).get("prose_allow", [])
    found = [f"cell {i}: {f}" for i, md in _markdown(nb) for f in typed_figures(md, allow)]
    assert not found, (f"{len(found)} typed figures: render them from the record (lib.prose) or "
                       "name their source in the sentence:\n" + "\n".join(found))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_short_sections(path):
    nb = _nb(path)
    cells = _markdown(nb) + _prose(nb)
    long = [(i, _words(t)) for i, t in cells if _words(t) > MAX_CELL_WORDS]
    assert not long, f"cells over {MAX_CELL_WORDS} words (cell, words): {long}"
    total = sum(_words(t) for _, t in cells)
    assert total <= MAX_NOTEBOOK_WORDS, f"{total} words of prose (at most {MAX_NOTEBOOK_WORDS})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_records_named_by_commit_not_by_session(path):
    nb = _nb(path)
    texts = _markdown(nb) + _prose(nb)
    found = [f"cell {i}: {m.group(0)!r}" for i, t in texts for m in SESSION.finditer(t)]
    assert not found, "name a record by commit, date and GPU:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_opens_with_what_you_learn_and_closes_with_takeaways(path):
    nb = _nb(path)
    texts = _markdown(nb) + _prose(nb)
    texts.sort()
    assert any(re.search(r"you will learn|you'll learn", t, re.I) for _, t in texts[:3]), \
        "the opening (first three markdown cells) says what the reader will learn"
    closing = "\n".join(t for _, t in texts[-3:])
    m = re.search(r"^#+ [^\n]*takeaways[^\n]*\n+((?:\s*[-*] [^\n]*\n?)+)", closing, re.I | re.M)
    assert m, "the closing (last three markdown cells) has a 'Takeaways' heading with bullets"
    bullets = [ln for ln in m.group(1).splitlines() if re.match(r"\s*[-*] ", ln)]
    assert 3 <= len(bullets) <= 6, f"{len(bullets)} takeaways (3-6)"


def test_typed_figure_rule_can_fail():
    assert typed_figures("Stage 6 runs at 612 TFLOPS, 1.08× SDPA.") == [
        "'612 TFLOPS' in …Stage 6 runs at 612 TFLOPS, 1.08× SDPA.…",
        "'1.08×' in …Stage 6 runs at 612 TFLOPS, 1.08× SDPA.…"]
    assert typed_figures("The FA3 paper (Fig. 5) gives 661 TFLOPS.") == []
    assert typed_figures("A 128×64 tile, `3.2 µs` in code, $2^8$.") == []
    assert typed_figures("| turns | 0.69× | `results/logs/2026-11-27-x/` |") == []
    assert SESSION.search("as session 36 measured") and SESSION.search("log s46call3")
    assert not SESSION.search("results/logs/2026-11-27-s46call4/device.log")


def test_docs_name_records_by_commit_not_by_session():
    docs = [ROOT / "README.md", ROOT / "experiments" / "README.md",
            *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*/README.md"))]
    found = [f"{p.relative_to(ROOT)}:{t.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for p in docs if p.exists() for t in [p.read_text()]
             for m in SESSION.finditer(t.replace("\n", " "))]  # a name broken across lines too
    assert not found, "name a record by commit, date and GPU:\n" + "\n".join(found)
