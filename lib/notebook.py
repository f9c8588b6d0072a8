"""Helpers the notebooks share, under one name (`from lib.notebook import ...`), in topic modules:
notebook_common (the banner, sources and diffs, checks, recorded rows and targets, ncu reports),
notebook_run (executing notebooks, and which ones are stale), notebook_sass (the stage 0-2
readings of SASS and profiles), notebook_stage34 (stage 3 and 4 evidence and counts),
notebook_ideas (stage 5 and 6 idea by idea), notebook_journey (every stage side by side),
notebook_fp8 (stage 7) and notebook_backward (stage 8).

    python -m lib.notebook --execute notebooks/X.ipynb   # execute in place, outputs kept
    python -m lib.notebook --stale            # the notebooks executed against older rows
    python -m lib.notebook --execute-stale    # execute those (GPU), after a re-record
    python -m lib.notebook --render-prose X   # render its prose cells from the record (no GPU)
    python -m lib.notebook --execute-cells X 12 14   # only these cells, e.g. source excerpts (no GPU)
"""
from __future__ import annotations

from lib.notebook_backward import *  # noqa: F401,F403
from lib.notebook_common import *  # noqa: F401,F403
from lib.notebook_common import ROOT, _md  # noqa: F401  (names the notebooks' cells use)
from lib.notebook_fp8 import *  # noqa: F401,F403
from lib.notebook_ideas import *  # noqa: F401,F403
from lib.notebook_journey import *  # noqa: F401,F403
from lib.notebook_run import *  # noqa: F401,F403
from lib.notebook_sass import *  # noqa: F401,F403
from lib.notebook_stage34 import *  # noqa: F401,F403
from lib.reference import compulsory_intensity, stage1_intensity  # noqa: F401
from lib.results import sdpa_spread  # noqa: F401
from lib.sass import innermost_loops  # noqa: F401

if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Execute notebooks in place, keeping outputs; or list "
                                 "(--stale) or execute (--execute-stale) the ones whose banner names "
                                 "other rows than the results file holds.")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--execute", nargs="+", metavar="NOTEBOOK")
    what.add_argument("--render-prose", nargs="+", metavar="NOTEBOOK",
                      help="render the prose cells (lib.prose) from the record and store them; no GPU needed")
    what.add_argument("--execute-cells", nargs="+", metavar=("NOTEBOOK", "INDEX"),
                      help="execute only these code cells (by index) in a fresh kernel and store their "
                           "outputs: for cells that need no GPU (a source excerpt, a table from the record)")
    what.add_argument("--stale", action="store_true", help="print them, one path a line (reasons on stderr)")
    what.add_argument("--execute-stale", action="store_true")
    what.add_argument("--prose-since", metavar="REV",
                      help="after executing notebooks: list the numbers their prose cites that their "
                           "outputs at git revision REV held and now do not (every notebook that changed)")
    args = ap.parse_args()
    if args.execute:
        sys.exit(execute(args.execute))
    if args.execute_cells:
        sys.exit(execute_cells(args.execute_cells[0], [int(i) for i in args.execute_cells[1:]]))
    if args.render_prose:
        sys.exit(render_prose(args.render_prose))
    if args.prose_since:
        import json
        import subprocess
        for p in sorted((ROOT / "notebooks").glob("*.ipynb")):
            rel = p.relative_to(ROOT)
            old = subprocess.run(["git", "show", f"{args.prose_since}:{rel}"], cwd=ROOT, capture_output=True, text=True)
            if old.returncode:
                continue
            for i, n, words in prose_to_check(json.loads(old.stdout), json.loads(p.read_text())):
                print(f"{rel} cell {i}: {n}: …{words}…")
        sys.exit(0)
    stale = stale_notebooks()
    for p, why in stale.items():
        print(f"{p.relative_to(ROOT)}: " + "; ".join(why), file=sys.stderr)
        if args.stale:
            print(p.relative_to(ROOT))
    if args.execute_stale:
        sys.exit(execute(list(stale)) if stale else 0)
