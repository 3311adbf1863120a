"""Every figure ZO2, MeZO and DistZO2 published stays within its tolerance
(benchmarks/published/published.py; docs/validation.md): a cost or memory term changed so that one
figure drifts out fails here, whichever figure it is, so no constant can be fitted to one
figure at another's expense unseen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))

import published  # noqa: E402

FIGURES = published.figures()


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.name)
def test_the_published_figure_is_within_its_tolerance(figure):
    assert figure.ok, (f"{figure.name}: published {figure.published:g}, predicted "
                       f"{figure.predicted:g} ({figure.error:+.1%}), outside "
                       f"{figure.low:g}..{figure.high:g} (docs/validation.md)")


def test_every_published_figure_is_checked():
    """7 memory figures, 5 speed ratios, DistZO2's, MeZO's fit: none dropped quietly."""
    kinds = [f.kind for f in FIGURES]
    assert kinds.count("memory") == 7 and kinds.count("ratio") == 6 and kinds.count("fits") == 1


def test_a_drifted_term_is_seen(monkeypatch):
    """The check can fail: with the context left out of NVML's count the small models'
    memory falls out of its tolerance; with a z draw ten times dearer the speed ratios do."""
    import zoplan.pricing.baselines as baselines
    import zoplan.pricing.memory as memory

    monkeypatch.setattr(memory, "nvml_terms", lambda profile: {})
    assert not all(f.ok for f in published.figures() if f.kind == "memory")
    monkeypatch.undo()
    monkeypatch.setattr(baselines, "TORCH_UPDATE_WORDS", 120)
    assert not all(f.ok for f in published.figures() if f.kind == "ratio")
