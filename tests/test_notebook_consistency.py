"""The notebooks say what the code does and quote the run that made their numbers (CPU only).

- Every committed notebook's banner names, for each stage whose rows it reads, the commit those
  rows carry in the results file now: a stage N notebook reads stages 0 to N, the others every
  stage. This fails after a re-record of those stages until the notebooks are re-executed on the
  GPU (scripts/gpu_session.sh runs both): a notebook executed against older rows carries older
  numbers. (A later re-record of a higher stage leaves a lower stage's notebook valid; only the
  SDPA medians behind its "vs SDPA" ratios, taken over every row of the file, may move a little.)
- A notebook names only kernel constructs (macros, functions, intrinsics, PTX) that its stage's
  sources contain: a curated list per notebook, checked both ways (the notebook names it, the
  sources have it), and a list of stale names that may appear only where the sources have them.
- Phrases that described code which no longer exists stay out.
- The ncu reading reports bank conflicts as measured or "not measured", never a default.
- The instruction microbenchmarks compile to the instructions they time (offline SASS).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import stages
from lib.notebook_run import banner_commits, cell_outputs, notebook_stage, stale_notebooks, stale_rows

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _nb(path):
    return nbformat.read(path, as_version=4)


def _text(nb) -> str:
    """What a notebook says and runs: markdown and code sources, not outputs (outputs show
    source files and diffs, which may quote older code on purpose)."""
    return "\n".join(c.source for c in nb.cells)


def _sources(n: int) -> str:
    return "\n".join((ROOT / p).read_text() for p in stages.get(n).INFO.sources)


# --------------------------------------------------------------------------------------------
# provenance

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_banner_names_the_results_commit(path):
    """Needs the notebooks executed against the current rows of the stages they read (GPU run):
    fails in between, by design, naming the commits the notebook was executed with
    (`python -m lib.notebook --execute-stale` executes exactly those)."""
    why = stale_rows(path)
    assert not why, (f"{path.name} was executed against other rows than results/ holds now: "
                     + "; ".join(why) + f"; re-execute it on the GPU: python -m lib.notebook --execute {path}")


def _notebook_with_banner(path, banner_text: str | None):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("from lib.notebook import show_banner\nshow_banner()")
    if banner_text is not None:
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": banner_text})]
    nb.cells = [nbformat.v4.new_markdown_cell("# a stage"), cell]
    nbformat.write(nb, path)
    return path


def test_stale_rows_names_each_stage_whose_rows_moved(tmp_path):
    data = {"env": {"commit": "aaaaaaa"},
            "stages": {"0": {"commit": "1111111"}, "1": {"commit": "2222222"}, "2": {"commit": "3333333"}}}
    text = "Recorded on X, stage 0 at commit 1111111, d; stages 1–2 at commit 2222222, d; file f."
    # stage 1's notebook reads stages 0 and 1 only: stage 2's newer rows do not make it stale
    assert stale_rows(_notebook_with_banner(tmp_path / "stage1_x.ipynb", text), data) == []
    why = stale_rows(_notebook_with_banner(tmp_path / "stage2_x.ipynb", text), data)
    assert len(why) == 1 and "stage 2" in why[0] and "3333333" in why[0] and "2222222" in why[0]
    # a notebook of no stage reads every stage
    assert len(stale_rows(_notebook_with_banner(tmp_path / "journey.ipynb", text), data)) == 1
    assert stale_rows(_notebook_with_banner(tmp_path / "stage0_x.ipynb", None), data) == [
        "the banner cell has no committed output"]
    found = stale_notebooks([tmp_path / "stage1_x.ipynb", tmp_path / "stage2_x.ipynb"], data)
    assert list(found) == [tmp_path / "stage2_x.ipynb"]


def test_a_notebook_that_reads_a_re_recorded_entry_is_stale(tmp_path):
    """An entry besides the stages' rows (the backward's, here) recorded at a commit that no output
    of a notebook reading it names makes that notebook stale; a notebook that does not read it is not."""
    data = {"env": {"commit": "aaaaaaa"}, "stages": {"0": {"commit": "1111111"}},
            "backward": {"env": {"commit": "bbbbbbb"}, "rows": []}}
    text = "Recorded on X, stage 0 at commit 1111111, d; file f."
    stage8 = _notebook_with_banner(tmp_path / "stage8_backward.ipynb", text)
    why = stale_rows(stage8, data)
    assert len(why) == 1 and "backward" in why[0] and "bbbbbbb" in why[0]
    assert stale_rows(_notebook_with_banner(tmp_path / "stage0_x.ipynb", text), data) == []
    # once an output names the entry's commit (a record line, as after executing it again), it is not
    nb = nbformat.read(stage8, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("show_backward_table(rec)", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/markdown": "*Recorded* on X at commit bbbbbbb, d"})]))
    nbformat.write(nb, stage8)
    assert stale_rows(stage8, data) == []


def test_banner_commits_are_read_from_the_provenance():
    text = ("stage 0 at commit c896d87, 2026-11-23 13:55 UTC; stages 1–3, 5 at commit ab5e7dc, "
            "2026-11-23 13:28 UTC; stage 6 at commit 3a7c64f, …")
    assert banner_commits(text) == {0: "c896d87", 1: "ab5e7dc", 2: "ab5e7dc", 3: "ab5e7dc",
                                     5: "ab5e7dc", 6: "3a7c64f"}
    assert banner_commits("Recorded on X, commit 4506624, 2026-11-20 10:00 UTC") == {None: "4506624"}


# --------------------------------------------------------------------------------------------
# constructs the notebooks name

NAMED = {  # notebook stem: constructs it names as part of its own stage's code
    "stage1_unfused_wmma": ["load_tile", "__syncthreads", "attention_scores",
                            "attention_softmax", "attention_pv"],
    "stage2_fused": ["load_tile", "rescale_of", "inv_l", "my_rows", "col_major",
                     "row_major", "exp2f"],
    "stage3_warp_softmax": ["__shfl_xor_sync", "load_tile"],
    "stage4_large_tiles": ["LOADS_IN_FLIGHT", "BLOCK_Q", "BLOCK_K", "__shfl_sync", "load_tile"],
    "stage5_vectorized": ["ex2.approx.ftz", "fast_exp2", "cp.async", "ldmatrix", "mma.sync",
                          "pack2", "at()", "NO_SWIZZLE", "STAGES", "WARP_Q", "__syncthreads"],
}
# names that once described stage code and may appear in a notebook only if its stage's
# sources have them
STALE = ["__any_sync", "__all_sync", "__ballot_sync", "__activemask"]
# phrases that described code or rules that are not so (issue 13)
STALE_PHRASES = ["FlashAttention-3's rule", "FlashAttention-3 rule", "FlashAttention-3 bound",
                 "seven small steps", "skipped when no row", "only when a max grew",
                 "exp2f fix-up, scale", "no operand registers", "limit without spilling",
                 "skipped-when-possible"]


@pytest.mark.parametrize("stem", sorted(NAMED))
def test_named_constructs_exist_in_the_stage_sources(stem):
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    text, n = _text(_nb(path)), notebook_stage(path)
    src = _sources(n)
    for name in NAMED[stem]:
        assert name in text, f"{stem} no longer names {name!r}: update NAMED in this test"
        probe = name[:-1] if name.endswith("()") else name  # at() is called as at(row, col)
        assert probe in src, f"{stem} names {name!r}, which stage {n}'s sources no longer contain"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if notebook_stage(p) is not None],
                         ids=lambda p: p.stem)
def test_no_stale_construct(path):
    text, src = _text(_nb(path)), _sources(notebook_stage(path))
    for name in STALE:
        assert name not in text or name in src, \
            f"{path.name} names {name!r}, which stage {notebook_stage(path)}'s sources do not contain"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stale_phrase(path):
    text = _text(_nb(path))
    for phrase in STALE_PHRASES:
        assert phrase not in text, f"{path.name} still says {phrase!r}"


def test_every_stage_after_0_states_its_prediction():
    """The journey compares each stage's INFO.prediction with the measurement: every CUDA C++
    stage whose notebook exists (and so makes a prediction) states it."""
    for mod in stages.all_stages():
        if mod.INFO.backend != "nvrtc" or not (ROOT / mod.INFO.notebook).exists():
            continue
        p = mod.INFO.prediction
        assert p.get("basis") and (p.get("tflops") or p.get("speedup") or p.get("of_matmul_ceiling")), \
            f"stage {mod.INFO.number}: INFO.prediction is empty"
        lo, hi = p.get("tflops") or p.get("speedup") or p.get("of_matmul_ceiling")
        assert 0 < lo <= hi


def test_every_stage_notebook_opens_with_its_summary():
    for path in NOTEBOOKS:
        n = notebook_stage(path)
        if n in stages.NUMBERS:  # the forward stages (stage 8's opens with its own outline)
            own = Path(stages.get(n).INFO.notebook).name
            if path.name == own:
                assert f"stage_summary({n}," in _text(_nb(path)), f"{path.name}: no stage_summary"
            else:  # a stage's second notebook (stage6b_decoding) continues its first and links it
                assert f"]({own})" in _text(_nb(path)), f"{path.name}: no link to {own}"


# --------------------------------------------------------------------------------------------
# what lib reads from the recorded profiles

def test_bank_conflicts_are_measured_or_not_measured():
    from lib.notebook import conflict_text, ncu_report
    reps = {k: ncu_report(k) for k in (1, 5, "5-noswizzle")}
    if any(r is None for r in reps.values()):
        pytest.skip("no recorded ncu profiles")
    scores = next(k for k in reps[1]["kernels"] if k["name"] == "attention_scores")
    if scores["shared"]["loads"]:
        # 16-element (32-byte) rows: an ldmatrix phase spans 256 bytes, two passes (2-way)
        assert 1.8 < scores["shared"]["loads"]["ways"] < 2.3
    plain = reps["5-noswizzle"]["kernels"][0]["shared"]["loads"]
    if plain:  # plain 128-byte rows: the 8 rows of a phase in the same 4 banks (8-way)
        assert 7.5 < plain["ways"] < 8.5
        assert plain["wavefronts_per_request"] > plain["ways"]  # x4: 4 wavefronts at best
    for rep in reps.values():
        for k in rep["kernels"]:
            for kind in ("loads", "stores"):
                c = k["shared"][kind]
                assert (c is None) == (conflict_text(k, kind) == "not measured")
                assert c is None or c["ways"] >= 1.0


def test_instruction_microbenchmarks_compile_to_what_they_time():
    from lib.microbench import check_sass
    for arch in ("sm_80", "sm_90"):
        out = check_sass(arch)  # raises if HMMA.16816 / MUFU.EX2 are missing or folded
        assert out["hmma_rate"]["unroll"] >= 1 and out["mufu_ex2_rate"]["unroll"] >= 1


def test_roofline_draws_the_instruction_ceilings():
    import matplotlib
    matplotlib.use("Agg")
    from lib.plots import mufu_roof_tflops, plot_roofline
    ceil = {"copy_GBps": 3000.0, "matmul_TFLOPS": 700.0, "hmma_TFLOPS": 600.0,
            "hmma_TFLOPS_min": 590.0, "hmma_TFLOPS_max": 610.0, "fp32_TFLOPS": 50.0,
            "mufu_ex2_Gops": 3000.0}
    ax = plot_roofline(ceil, (1, 1e4), head_dims=(64, 128))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("mma.sync" in t and "[590–610]" in t for t in labels)
    assert sum("MUFU.EX2" in t for t in labels) == 2
    assert mufu_roof_tflops(ceil, 64) == pytest.approx(3000e9 * 256 / 1e12)


def test_raw_shared_counters_are_read(tmp_path, monkeypatch):
    """The profile step's --metrics table, with ncu's line wrap of long names."""
    import lib.notebook_common as N  # where ncu_report reads PROFILE_DIR and ROOT
    block = """# header line
  attention_fused (16, 256, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    ----------------------------------------------------------- ----------- ------------
    Metric Name                                                 Metric Unit Metric Value
    ----------------------------------------------------------- ----------- ------------
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum                            0
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum                       12,000
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
                                                                                84,410,368
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum                           536,288
    smsp__sass_inst_executed_op_ldsm.sum                                 inst   21,102,592
    smsp__sass_inst_executed_op_shared_ld.sum                            inst            0
"""
    # ncu counts ldmatrix apart from the other shared loads (a real stage 5 report: 131,072
    # shared loads, 20,971,520 LDSM): the requests are their sum
    monkeypatch.setattr(N, "PROFILE_DIR", tmp_path)
    monkeypatch.setattr(N, "ROOT", tmp_path)
    (tmp_path / "stage9-throughput.ncu.txt").write_text(block)
    k = N.ncu_report(9)["kernels"][0]
    assert k["shared"]["loads"]["ways"] == 1.0 and k["shared"]["loads"]["source"] == "ncu metrics"
    assert k["shared"]["loads"]["wavefronts_per_request"] == pytest.approx(4.0)
    assert k["shared"]["stores"]["ways"] == pytest.approx(536288 / 524288)
    assert k["ldsm"] == 21102592


# A range the prose calls predicted ("predicted 233–699 TFLOPS", "predicted 1.18x to 1.77x"), and
# a median it quotes as a ratio ("median 0.99×"): each must be printed by one of the notebook's
# own outputs, so that a re-execution against a new record cannot leave the prose behind.
PROSE_PREDICTION = re.compile(r"predicted (?:range )?(?:of )?\(?(\d[\d,.]*)\s*(?:–|-|to)\s*(\d[\d,.]*)\s*(?:TFLOPS|×|x)", re.I)
PROSE_MEDIAN = re.compile(r"median[^.\n]{0,60}?(\d+\.\d+)\s*[×x]", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_quoted_predictions_and_medians_are_printed(path):
    nb = _nb(path)
    outputs = "\n".join(cell_outputs(c) for c in nb.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    missing = [m.group(0) for m in PROSE_PREDICTION.finditer(prose)
               if not re.search(re.escape(m.group(1)) + r"\s*(?:–|-|to)\s*" + re.escape(m.group(2)), outputs)]
    missing += [m.group(0) for m in PROSE_MEDIAN.finditer(prose) if m.group(1) not in outputs]
    assert not missing, f"{path.name}: the prose quotes what no output prints: {missing}"


def test_stage6_prediction_is_the_notebooks_count():
    """stage6.INFO.prediction (fractions of the matmul ceiling, the count of section 2) times the
    ceiling the notebook printed is the range its section 9 prints, at D64."""
    import stages.stage6 as s6
    nb = _nb(ROOT / "notebooks" / "stage6_wgmma_tma.ipynb")
    outputs = "\n".join(cell_outputs(c) for c in nb.cells if c.cell_type == "code")
    ceiling = float(re.search(r"matmul ceiling (\d+) TFLOPS", outputs).group(1))
    lo, hi = s6.INFO.prediction["of_matmul_ceiling"]
    printed = re.search(r"D64: predicted (\d+)–(\d+) TFLOPS", outputs)
    assert printed, "section 9 prints the D64 prediction"
    assert abs(int(printed.group(1)) - lo * ceiling) <= 1.5 and abs(int(printed.group(2)) - hi * ceiling) <= 1.5, \
        (printed.group(0), lo * ceiling, hi * ceiling)


def test_stage7_count_shares_the_exponential_unit():
    """Stage 7's count (notebook section 2, lib.notebook_fp8.prediction): the SM's consumers share
    one exponential unit, so per key tile it does every consumer's exponentials, and no period is
    shorter. At D 64 one warpgroup's exponentials take as many cycles as its bf16 products, so FP8's
    top there is at most the bf16 tensor-core roof, and with stage 7's tiles it is that roof. The
    notebook's stored table prints the count."""
    import stages.stage7 as s7
    from lib.notebook_fp8 import FLOP_PER_CLOCK, MUFU_EX2_PER_CLOCK, count, prediction
    clock, sms = 1.5e9, 132
    pred = prediction(s7.TILES, clock, sms=sms)
    for D, p in pred.items():
        bn, _, cons = s7.TILES[D]
        assert p["mufu_cycles"] == pytest.approx(cons * 64 * bn / MUFU_EX2_PER_CLOCK)
        assert p["period_hi"] == pytest.approx(max(cons * p["gemm_cycles"], p["gemm_cycles"] + 2 * p["exp_cycles"],
                                                   p["mufu_cycles"]))
    roof16 = sms * FLOP_PER_CLOCK["bf16"] * clock / 1e12
    p64 = pred[64]
    assert p64["exp_cycles"] == pytest.approx(p64["gemm16_cycles"])
    assert p64["tflops"][1] == pytest.approx(roof16) and p64["bound"] == ["shared MUFU"]
    c = count(s7.TILES)
    nb = _nb(ROOT / "notebooks" / "stage7_fp8.ipynb")
    table = "\n".join(cell_outputs(cell) for cell in nb.cells if cell.get("id") == "09089d85")
    for D in s7.TILES:
        assert f"| {c['low'][D]:.0f}–{c['top'][D]:.0f} |" in table, (D, c["low"][D], c["top"][D])


_SHOWN = re.compile(r"\bshow_(source|part_diff)\((.*)\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_shown_sources_have_their_markers(path):
    """Every show_source / show_part_diff call of a notebook cuts its file at lines that exist
    (lib.notebook_common.source_span): an edited source line must not leave a cell quoting
    another part of the file, or all of it."""
    import ast

    from lib.notebook_common import source_span
    calls = 0
    for cell in _nb(path).cells:
        if cell.cell_type != "code":
            continue
        for kind, args in _SHOWN.findall(cell.source):
            try:
                values = ast.literal_eval(f"({args},)")
            except (ValueError, SyntaxError):
                continue  # arguments computed in the cell: checked when it runs
            files = values[:1] if kind == "source" else values[:2]
            marks = values[1:] if kind == "source" else values[2:]
            for f in files:
                source_span((ROOT / f).read_text().splitlines(), *(list(marks) + [None, None])[:2], f)
                calls += 1
    if "show_source" in _text(_nb(path)):
        assert calls, f"{path.name}: no show_source call was read"


def test_prose_to_check_finds_the_numbers_whose_outputs_moved():
    """lib.notebook_run.prose_to_check: a number the prose cites that the outputs held before a
    run and not after is listed (with commas, decimals, in a list-of-lines JSON or as one
    string); one the outputs still hold, one they never held (history) and a two-digit one are
    not."""
    import json

    import nbformat
    from lib.notebook_run import prose_to_check

    def notebook(prose, out):
        nb = nbformat.v4.new_notebook()
        code = nbformat.v4.new_code_cell("show()")
        code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)]
        nb.cells = [nbformat.v4.new_markdown_cell(prose), code]
        return json.loads(nbformat.writes(nb))

    prose = "Stage 2 takes 5,254 µs (1.91×), 81.3 µs at the latency shape; 3,001 GB/s; 12 µs; in 2024 it took 9,999."
    before = notebook(prose, "| 2 | 5,254 | 1.91× | 81.3 | 3,001 | 12 |")
    after = notebook(prose, "| 2 | 5,205 | 1.91× | 82.0 | 3,001 | 11 |")
    found = prose_to_check(before, after)
    assert [(i, n) for i, n, _ in found] == [(0, "5,254"), (0, "81.3")]
    assert "Stage 2 takes 5,254" in found[0][2]
    assert prose_to_check(after, after) == []
