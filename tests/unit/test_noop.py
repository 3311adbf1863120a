"""zoexec.launch.noop's --lr rule: an update that rounds back to the weight even at the
largest |g| expected is refused with round to nearest, a warning with stochastic
rounding (which keeps it in expectation) at the fp32 threshold only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zoexec.launch.noop import check_lr, g_bound, sample_weights, vanishing_lr
from zoplan.errors import ZoError


def test_the_lr_rule_in_each_precision():
    weights = torch.full((1000,), 0.02, dtype=torch.float64)   # half an ulp: 2^-30 fp32, 2^-14 bf16
    g = g_bound(50272, 1e-3)                                   # ln(50272) / 2e-3: about 5,400
    assert g == pytest.approx(5412.7, rel=1e-3)
    for dtype in (torch.float32, torch.bfloat16):
        assert vanishing_lr(1e-6, g, weights, dtype, update="plain") is None   # MeZO's lr kept
    assert vanishing_lr(1e-9, g, weights, torch.bfloat16, update="plain") is not None
    assert vanishing_lr(1e-9, g, weights, torch.float32, update="master") is None
    assert vanishing_lr(1e-14, g, weights, torch.float32, update="master") is not None
    assert vanishing_lr(1e-30, g, torch.zeros(8, dtype=torch.float64), torch.float32,
                        update="master") is None


class _Store:
    num_blocks = 2

    def weights(self, block: int) -> torch.Tensor:
        return torch.full((64,), 0.02, dtype=torch.bfloat16)


def _sample() -> torch.Tensor:
    store = _Store()
    return sample_weights(store.weights(b) for b in range(store.num_blocks))


def _cfg(lr: float, update: str, param: str = "bf16", eps: float = 1e-3) -> SimpleNamespace:
    return SimpleNamespace(optim=SimpleNamespace(lr=lr, eps=eps), model_spec=SimpleNamespace(vocab=512),
                           workload=SimpleNamespace(frozen_base=False, update=update, param_dtype=param))


def test_round_to_nearest_is_refused_and_stochastic_rounding_warned_far_lower():
    warned: list[str] = []
    with pytest.raises(ZoError, match=r"--lr 1e-09 vanishes .* rounded to nearest in bf16"):
        check_lr(_cfg(1e-9, "plain"), _sample(), warn=warned.append)
    check_lr(_cfg(1e-9, "stochastic"), _sample(), warn=warned.append)   # kept in expectation
    assert warned == []
    with pytest.raises(ZoError, match=r"--lr 1e-15 vanishes .* rounded to nearest in fp32"):
        check_lr(_cfg(1e-15, "master"), _sample(), warn=warned.append)   # fp32 masters
    check_lr(_cfg(1e-15, "stochastic"), _sample(), warn=warned.append)
    assert len(warned) == 1 and warned[0].startswith("zoexec: warning: --lr 1e-15 vanishes")
    assert "computed in fp32 before the stochastic rounding" in warned[0]


def test_an_eps_beyond_the_weights_leaves_g_unbounded_and_the_lr_unjudged():
    """--eps 1e30 (the perturbed weights overflow): no |g| bounds the update, so the lr is
    not refused (the first step's non-finite loss says what is wrong); an eps below the
    weights' median keeps the rule (before: "--lr 1e-06 vanishes ... give --lr 3e+20")."""
    check_lr(_cfg(1e-6, "master", eps=1e30), _sample(), warn=pytest.fail)
    check_lr(_cfg(1e-6, "master", eps=0.5), _sample(), warn=pytest.fail)    # 0.5 > |theta| 0.02
    with pytest.raises(ZoError, match=r"--lr 1e-15 vanishes"):
        check_lr(_cfg(1e-15, "master", eps=1e-2), _sample(), warn=pytest.fail)
