"""Report figures: matplotlib on its Agg backend, each figure saved atomically and closed.

matplotlib is imported on first use, so commands that draw nothing start without it. Agg needs no display
(pods, CI) and draws from any thread. Like ``atomic``, this module imports nothing above the core.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdk8s.common.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> Any:
    """``matplotlib.pyplot``, on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from its suffix) so a reader never sees half a file; close it either way."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        pyplot().close(fig)
    return Path(path)
