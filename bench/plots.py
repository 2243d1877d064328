"""What every benchmark plot shares: a headless backend and one way to write a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> str:
    """Lay ``fig`` out, write it to ``path`` as PNG at 110 dpi, close it; returns the path as text."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
