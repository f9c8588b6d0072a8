"""Executing notebooks in place, and knowing which ones need it: a committed notebook shows the
recorded rows it was executed against, named in its banner (lib.notebook_common.show_banner), so
a re-record of any stage it reads leaves it stale until it runs again on the GPU."""
from __future__ import annotations

import json
import re
from pathlib import Path

from lib import results as R

ROOT = Path(__file__).resolve().parent.parent


def banner_commits(text: str) -> dict:
    """{stage: commit} from a banner's provenance ("stage 0 at commit c896d87, …; stages 1–5 at
    commit ab5e7dc, …"; lib.results.provenance), or {None: commit} for a single-commit file."""
    found = {}
    for group, commit in re.findall(r"stages? ([\d–, ]+?) at commit ([0-9a-f]{7,})", text):
        for part in group.split(","):
            lo, _, hi = part.strip().partition("–")
            for n in range(int(lo), int(hi or lo) + 1):
                found[n] = commit
    if not found:
        m = re.search(r"commit ([0-9a-f]{7,})", text)
        if m:
            found[None] = m.group(1)
    return found


def cell_outputs(cell) -> str:
    """A code cell's committed outputs as text: streams and every rich representation."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append("".join(o.get("text", "")))  # a list of lines in raw JSON, one str in nbformat's
        for v in (o.get("data") or {}).values():
            parts.append("".join(v) if isinstance(v, list) and all(isinstance(x, str) for x in v)
                         else v if isinstance(v, str) else json.dumps(v))
    return "\n".join(parts)


def notebook_stage(path) -> int | None:
    """N for notebooks/stageN_*.ipynb, None for the others (introduction, journey)."""
    name = Path(path).stem
    return int(name[5]) if name.startswith("stage") and name[5:6].isdigit() else None


# The record's entries besides the stages' rows that a notebook's outputs show (each names its
# entry's commit in a record line or in prose: lib.prose.record_name, lib.notebook_backward.record_line).
# A re-record of one leaves the notebook stale as a re-record of a stage's rows does.
ENTRY_READERS = {
    "journey": ("backward", "fp8_bench", "generate", "training"),
    "stage6b_decoding": ("paged", "fp8_decode"),
    "stage6c_model_features": ("stage6_variants", "generate_models", "backward_variants"),
    "stage7_fp8": ("fp8_bench", "fp8_tiles", "fp8_waterfall"),
    "stage8_backward": ("backward", "backward_head_dims", "train_step", "training"),
}


def stale_entries(path, nb, data: dict) -> list[str]:
    """Why a notebook no longer shows the record's entries it reads (ENTRY_READERS): an entry's
    commit that none of its committed outputs names."""
    out = "\n".join(cell_outputs(c) for c in nb.cells if c.cell_type == "code")
    why = []
    for name in ENTRY_READERS.get(Path(path).stem, ()):
        commit = ((data.get(name) or {}).get("env") or {}).get("commit", "")[:7]
        if commit and commit not in out:
            why.append(f"{name}: recorded at commit {commit}, which no output of the notebook names")
    return why


def stale_rows(path, data: dict | None = None) -> list[str]:
    """Why a committed notebook no longer matches the results file, one line per stage: its banner
    (the first cell that calls show_banner) names, for a stage it reads, another commit than the
    stage's rows carry now. A stage N notebook reads stages 0 to N, the others every stage. Empty:
    executed against today's rows. A re-record of any stage a notebook reads makes it stale until
    it is executed again on the GPU (tests/test_notebook_consistency.py holds CI to this); so does
    one of the other entries it reads (stale_entries)."""
    import nbformat
    data = R.load() if data is None else data
    if not data:
        return ["no results file"]
    nb = nbformat.read(path, as_version=4)
    banner_cell = next((c for c in nb.cells if c.cell_type == "code" and "show_banner" in c.source), None)
    if banner_cell is None:
        return ["no show_banner() cell"]
    out = cell_outputs(banner_cell)
    if not out:
        return ["the banner cell has no committed output"]
    shown, n = banner_commits(out), notebook_stage(path)
    why = []
    for k, st in sorted(data["stages"].items(), key=lambda kv: int(kv[0])):
        if n is not None and int(k) > n:
            continue
        now = st.get("commit", data["env"]["commit"])[:10]
        was = shown.get(int(k), shown.get(None))
        if was is None or not (now.startswith(was) or was.startswith(now)):
            why.append(f"stage {k}: the rows are commit {now}'s, the banner says {was}")
    return why + stale_entries(path, nb, data)


def stale_notebooks(paths=None, data: dict | None = None) -> dict:
    """{path: stale_rows} for the notebooks (default: every one in notebooks/) that need executing
    again against the results file."""
    data = R.load() if data is None else data
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) if paths is None else [Path(p) for p in paths]
    return {p: why for p in paths if (why := stale_rows(p, data))}


def output_text(nb: dict) -> str:
    """Every code cell's committed outputs of a notebook (as JSON), as one text."""
    return "\n".join(cell_outputs(c) for c in nb["cells"] if c.get("cell_type") == "code")


_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def prose_to_check(before: dict, after: dict) -> list[tuple[int, str, str]]:
    """After a notebook ran again: the numbers its markdown cites that its outputs held before and
    hold no longer, [(cell index, number, the words around it)] — prose that may describe the old
    outputs. Numbers of fewer than three digits are left out (too common to tell), so an empty
    list is no proof that the prose is current; it only finds what moved. `before` and `after`
    are the notebook's JSON (nbformat 4) before and after its execution."""
    old, new = output_text(before), output_text(after)
    found = []
    for i, cell in enumerate(after["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        text = "".join(cell["source"])
        for m in _NUMBER.finditer(text):
            n = m.group(0)
            if sum(ch.isdigit() for ch in n) >= 3 and n in old and n not in new:
                found.append((i, n, " ".join(text[max(0, m.start() - 60):m.end() + 30].split())))
    return found


def execute(paths, timeout=1200) -> int:
    """Execute notebooks in place (outputs kept), as on the GPU before committing them."""
    import time

    import nbformat
    from nbclient import NotebookClient
    failed = 0
    for p in map(Path, paths):
        t0 = time.time()
        nb = nbformat.read(p, as_version=4)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(p.parent)}}).execute()
            status = "ok"
        except Exception as e:  # keep going: write what ran, report the failure
            failed += 1
            status = f"FAILED: {type(e).__name__}: {str(e)[-2000:]}"
        nbformat.write(nb, p)
        print(f"{p}: {status} ({time.time() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# prose cells (lib.prose): rendered from the record alone, without a kernel or a GPU

def is_prose_cell(cell) -> bool:
    from lib.prose import PROSE_MARK
    src = "".join(cell.get("source", ""))
    return cell.get("cell_type") == "code" and src.split("\n", 1)[0].strip() == PROSE_MARK


def _markdown_output(text: str) -> dict:
    # what IPython's display(Markdown(text)) stores, so that nbval's comparison sees the same
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": text, "text/plain": "<IPython.core.display.Markdown object>"}}


def render_prose_cells(nb: dict, path: Path) -> list[tuple[int, list[dict]]]:
    """[(cell index, outputs)] of every prose cell of notebook `nb`, executed in order in one
    namespace (each may use what earlier prose cells defined), as lib.prose.say renders them."""
    import os

    from lib import prose
    ns: dict = {"__name__": "__prose__"}
    rendered = []
    cwd = os.getcwd()
    os.chdir(Path(path).parent)  # where the notebook's own cells run
    try:
        for i, cell in enumerate(nb["cells"]):
            if not is_prose_cell(cell):
                continue
            prose._sink = sink = []
            try:
                exec(compile("".join(cell["source"]), f"{Path(path).name} cell {i}", "exec"), ns)
            except Exception as e:
                raise RuntimeError(f"{path} cell {i}: a prose cell failed ({type(e).__name__}: {e}); "
                                   "it may use only what earlier prose cells define") from e
            finally:
                prose._sink = None
            rendered.append((i, [_markdown_output(t) for t in sink]))
    finally:
        os.chdir(cwd)
    return rendered


def stored_markdown(cell) -> list[str]:
    return ["".join(o["data"]["text/markdown"]) if isinstance(o["data"]["text/markdown"], list)
            else o["data"]["text/markdown"]
            for o in cell.get("outputs", []) if "text/markdown" in (o.get("data") or {})]


def stale_prose(path) -> list[str]:
    """The prose cells of a notebook whose stored rendering is not what the record gives now."""
    nb = json.loads(Path(path).read_text())
    out = []
    for i, outputs in render_prose_cells(nb, path):
        want = [o["data"]["text/markdown"] for o in outputs]
        if stored_markdown(nb["cells"][i]) != want:
            out.append(f"{Path(path).name} cell {i}")
    return out


def render_prose(paths) -> int:
    """Render every prose cell of each notebook from the record and store its outputs in place
    (the other cells and their outputs untouched): after a re-record, or after editing prose."""
    for p in map(Path, paths):
        nb = json.loads(p.read_text())
        rendered = render_prose_cells(nb, p)
        for i, outputs in rendered:
            nb["cells"][i]["outputs"] = outputs
            # nbval skips the comparison of a cell stored without an execution count
            nb["cells"][i]["execution_count"] = nb["cells"][i].get("execution_count") or 1
        import nbformat
        nbformat.write(nbformat.from_dict(nb), p)
        print(f"{p}: {len(rendered)} prose cells rendered")
    return 0


def execute_cells(path, indices, timeout=600) -> int:
    """Execute only the code cells `indices` of a notebook, in order, in one fresh kernel, and
    store their outputs in place (every other cell untouched). For cells whose output does not
    depend on a GPU — a source excerpt, a diff, a table or plot drawn from the record — after
    their code or the files they read changed. Each cell must import what it uses. A cell that
    runs a kernel would store this machine's outputs: run those with --execute on the GPU."""
    import nbformat
    from nbclient import NotebookClient
    p = Path(path)
    nb = nbformat.read(p, as_version=4)
    for i in indices:
        if nb.cells[i].cell_type != "code":
            raise ValueError(f"{p} cell {i} is not a code cell")
    part = nbformat.v4.new_notebook(metadata=nb.metadata)
    part.cells = [nbformat.from_dict(json.loads(json.dumps(nb.cells[i]))) for i in indices]
    NotebookClient(part, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(p.parent)}}).execute()
    for i, cell in zip(indices, part.cells):
        nb.cells[i].outputs = cell.outputs
        nb.cells[i].execution_count = nb.cells[i].execution_count or cell.execution_count
    nbformat.write(nb, p)
    print(f"{p}: cells {', '.join(map(str, indices))} executed")
    return 0
