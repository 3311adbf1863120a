"""What zoplan prints and exports: rich tables, panels and Gantt charts, Chrome trace
events and SVG. Views take plans, traces and results; they never compute them."""

import os
import sys

from rich.console import Console

PIPED_WIDTH = 200   # columns of output that is not a terminal's (a pipe, a file)


def stdout_console() -> Console:
    """The console zoplan prints to: a terminal's own width; piped or redirected (and no
    COLUMNS set), PIPED_WIDTH columns and prose unwrapped, so that a wide table is not
    cut ("bottl…") nor a line broken at 80 columns."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPED_WIDTH, soft_wrap=True)
