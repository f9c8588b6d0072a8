"""Helpers the notebooks share, under one name (`from lib.notebook import ...`), in topic modules:
notebook_common (the banner, sources and diffs, checks, recorded rows and targets, ncu reports,
executing notebooks), notebook_sass (the stage 0-2 readings of SASS and profiles),
notebook_stage34 (stage 3 and 4 evidence and counts), notebook_ideas (stage 5 and 6 idea by
idea), notebook_journey (every stage side by side), notebook_fp8 (stage 7) and notebook_backward (stage 8).

    python -m lib.notebook --execute notebooks/X.ipynb   # execute in place, outputs kept
"""
from __future__ import annotations

from lib.notebook_backward import *  # noqa: F401,F403
from lib.notebook_common import *  # noqa: F401,F403
from lib.notebook_common import ROOT, _md  # noqa: F401  (names the notebooks' cells use)
from lib.notebook_fp8 import *  # noqa: F401,F403
from lib.notebook_ideas import *  # noqa: F401,F403
from lib.notebook_journey import *  # noqa: F401,F403
from lib.notebook_sass import *  # noqa: F401,F403
from lib.notebook_stage34 import *  # noqa: F401,F403
from lib.reference import compulsory_intensity, stage1_intensity  # noqa: F401
from lib.results import sdpa_spread  # noqa: F401
from lib.sass import innermost_loops  # noqa: F401

if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Execute notebooks in place, keeping outputs.")
    ap.add_argument("--execute", nargs="+", required=True, metavar="NOTEBOOK")
    sys.exit(execute(ap.parse_args().execute))
