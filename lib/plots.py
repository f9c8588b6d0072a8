"""Plots of recorded or live results (matplotlib, no display needed), under one name
(`from lib import plots`), in topic modules: plots_common (recorded stages and sweeps, the
roofline), plots_stage6, plots_journey and plots_early (the stage 0-3 figures); stage 8's pictures
are plots_backward's (the stage 8 notebook takes them through lib.notebook)."""
from __future__ import annotations

from lib.plots_common import *  # noqa: F401,F403
from lib.plots_common import _log_axes  # noqa: F401
from lib.plots_early import *  # noqa: F401,F403
from lib.plots_journey import *  # noqa: F401,F403
from lib.plots_stage6 import *  # noqa: F401,F403
