"""transformers' progress bars off for a while, as they were afterwards (the commands
print their own lines; a caller in the same process keeps its own setting)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """transformers' progress bars (loading, saving) off inside; restored on the way
    out, also when the block raises."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
