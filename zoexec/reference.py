"""In-process training loops used as baselines and test oracles (single process, no
offloading, no torch.distributed).

- `mezo_reference_train`: plain MeZO-SGD (arXiv 2305.17333, Algorithm 1) on the ordinary
  HF model: per step perturb +eps*z in place, loss, -2eps*z, loss, +eps*z (restore),
  then the update with z regenerated: FOUR z generations per step. z comes from
  zo.z_tensor with the same (step seed, block, tensor) addresses as the block-wise
  path, so both loops follow the same random directions. This is the baseline of the
  throughput benchmark.
- `zo2_reference_train`: the schedule zoexec runs, in one process: blocks from flat
  buffers, the update of step t-1 deferred to the moment block b is next used in step t,
  perturbed weights built out of place (theta +- eps*z, no restore; TWO z generations
  per block per step) and a final flush of the last pending update. For one seed and
  batch schedule it equals plain MeZO up to float rounding (tests/unit/test_zo_maths.py),
  and every layout of the distributed engine must reproduce it.
- `lora_reference_train`: plain MeZO-SGD over LoRA adapters of the HF model wrapped by
  peft (get_peft_model, LoraConfig): perturb the adapters in place +eps*z, loss, -2eps*z,
  loss, +eps*z, update; z of adapter tensor i of block b from zo.z_tensor(seed, b, i)
  (zoexec.model.lora's order: per target module lora_A then lora_B), the adapters
  initialised as zoexec.model.lora.init_adapters draws them. A LoRA run of any layout
  must equal it to float tolerance.
- `estimator_reference_train`: the same deferred-update schedule with the estimators of
  zoplan.estimators (lowrank, sparse, several directions a step), each direction
  written plainly from its definition (plain_direction: whole tensors, no tiles, no
  ranges, no kept thresholds): the one-rank engine must equal it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from zoexec.data.batch import Batch, as_batch
from zoexec.maths import zo
from zoexec.maths.estimators import DIRECTION_TAG, LOWRANK_V, lowrank_factors
from zoexec.maths.zo import mix_seed
from zoexec.model import heads
from zoexec.model.families import (
    ModelParts,
    TensorSpec,
    adapter_for,
    bind_block,
    bind_resident,
    param_addresses,
    resident_flat,
)
from zoexec.model.lora import init_adapters, lora_spec, peft_key
from zoplan.estimators import SPARSE_STRIDE, EstimatorSpec, is_matrix

# A run's batches: batches[step] or batches(step), the input ids or a Batch (its labels)
Batches = Sequence[torch.Tensor | Batch] | Callable[[int], torch.Tensor | Batch]
# (name, parameter, block, tensor index) of each trained tensor, in the z addressing
Addresses = Sequence[tuple[str | None, torch.Tensor, int, int]]
Losses = tuple[float, float, float]   # (l+, l-, g) of a step
# the deferred update of a step: (step, seed, lr, g of each direction)
PlainPending = tuple[int, int, float, tuple[float, ...]]
T = TypeVar("T")


def _batch_at(batches: Batches, step: int) -> torch.Tensor | Batch:
    return batches(step) if callable(batches) else batches[step]


def _perturb_model(addresses: Addresses, seed: int, scale: float) -> None:
    for _, param, block, index in addresses:
        param.add_(zo.z_tensor(seed, block, index, param.shape, device=param.device), alpha=scale)


def _update_model(addresses: Addresses, seed: int, *, lr: float, g: float,
                  weight_decay: float) -> None:
    for _, param, block, index in addresses:
        z = zo.z_tensor(seed, block, index, param.shape, device=param.device)
        wd = weight_decay if param.dim() >= 2 else 0.0
        param.sub_(lr * (g * z + wd * param))


def mezo_reference_train(model: torch.nn.Module, batches: Batches, *, seed: int, lr: float,
                         eps: float, weight_decay: float, steps: int) -> list[Losses]:
    """Train `model` (an HF *ForCausalLM, modified in place) with plain MeZO-SGD for
    `steps` steps; batches[step] (or batches(step)) gives the input ids. Returns the
    (loss_plus, loss_minus, g) of each step."""
    with torch.no_grad():
        model.eval()
        addresses = param_addresses(model)
        history: list[Losses] = []
        for step in range(steps):
            ids, s = _batch_at(batches, step), zo.step_seed(seed, step)
            _perturb_model(addresses, s, eps)
            loss_plus = float(model(ids, labels=ids).loss)
            _perturb_model(addresses, s, -2 * eps)
            loss_minus = float(model(ids, labels=ids).loss)
            _perturb_model(addresses, s, eps)
            g = zo.projected_grad(loss_plus, loss_minus, eps)
            _update_model(addresses, s, lr=lr, g=g, weight_decay=weight_decay)
            history.append((loss_plus, loss_minus, g))
        return history


class _Zo2State:
    """Buffers of the in-process ZO2 schedule: clean resident copy, working copies, z."""

    def __init__(self, parts: ModelParts) -> None:
        self.resident = resident_flat(parts)          # on the parts' device
        dev = self.resident.device
        self.resident_work = torch.empty_like(self.resident)
        self.resident_z = torch.empty(parts.resident_numel, dtype=torch.float32, device=dev)
        self.block_work = torch.empty(parts.block_numel, dtype=parts.dtype, device=dev)
        self.block_z = torch.empty(parts.block_numel, dtype=torch.float32, device=dev)


def _refresh(theta: torch.Tensor, z_out: torch.Tensor, specs: Sequence[TensorSpec], block: int,
             *, seed: int, pending: tuple[int, float] | None, lr: float,
             weight_decay: float) -> torch.Tensor:
    """Apply the pending (seed, g) update to theta, then draw this step's z into z_out."""
    if pending is not None:
        prev_seed, prev_g = pending
        zo.z_block(prev_seed, block, specs, out=z_out)
        zo.apply_update(theta, z_out, lr=lr, g=prev_g, weight_decay=weight_decay,
                        decay_mask_or_specs=specs)
    return zo.z_block(seed, block, specs, out=z_out)


def _resident_call(parts: ModelParts, st: _Zo2State, eps: float, fn: Callable[[], T]) -> list[T]:
    """Run fn under resident weights +eps*z, then -eps*z: (fn(+), fn(-))."""
    out: list[T] = []
    for scale in (eps, -eps):
        zo.perturb_into(st.resident_work, st.resident, st.resident_z, scale)
        out.append(fn())
    return out


def _zo2_step(parts: ModelParts, st: _Zo2State, flats: Sequence[torch.Tensor],
              rows: torch.Tensor | Batch, *, seed: int, pending: tuple[int, float] | None,
              lr: float, eps: float, weight_decay: float) -> Losses:
    batch = as_batch(rows)
    ids = batch.ids
    refresh = functools.partial(_refresh, seed=seed, pending=pending, lr=lr,
                                weight_decay=weight_decay)
    refresh(st.resident, st.resident_z, parts.resident_specs, zo.RESIDENT_BLOCK)
    bind_resident(parts, st.resident_work)
    (h_plus, ctx), (h_minus, _) = _resident_call(parts, st, eps, lambda: parts.embed(ids))
    bind_block(parts, st.block_work)
    for block, theta in enumerate(flats):
        z = refresh(theta, st.block_z, parts.block_specs, block)
        zo.perturb_into(st.block_work, theta, z, eps)
        h_plus = parts.block_forward(h_plus, ctx)
        zo.perturb_into(st.block_work, theta, z, -eps)
        h_minus = parts.block_forward(h_minus, ctx)
    losses = iter((h_plus, h_minus))
    loss_plus, loss_minus = _resident_call(parts, st, eps, lambda: _loss(parts, next(losses), batch))
    return loss_plus, loss_minus, zo.projected_grad(loss_plus, loss_minus, eps)


def _loss(parts: ModelParts, hidden: torch.Tensor, batch: Batch) -> float:
    """The batch's mean loss, computed as the engine's head does (zoexec.model.heads)
    and divided on the host as the engine does (a division on a GPU may multiply by the
    reciprocal: the H200 check saw the last bit of a float64 differ)."""
    total, count = heads.loss_sum(parts, hidden, batch)
    return float(total) / count


def flush_pending(parts: ModelParts, resident: torch.Tensor, flats: list[torch.Tensor],
                  pending: tuple[int, float], *, lr: float, weight_decay: float) -> None:
    """Apply the last step's deferred update to the resident copy and every block."""
    seed, g = pending
    z = zo.z_block(seed, zo.RESIDENT_BLOCK, parts.resident_specs,
                   out=torch.empty(parts.resident_numel, dtype=torch.float32, device=resident.device))
    zo.apply_update(resident, z, lr=lr, g=g, weight_decay=weight_decay,
                    decay_mask_or_specs=parts.resident_specs)
    z = torch.empty(parts.block_numel, dtype=torch.float32, device=resident.device)
    for block, theta in enumerate(flats):
        zo.z_block(seed, block, parts.block_specs, out=z)
        zo.apply_update(theta, z, lr=lr, g=g, weight_decay=weight_decay,
                        decay_mask_or_specs=parts.block_specs)


def zo2_reference_train(parts: ModelParts, flats: list[torch.Tensor], batches: Batches, *,
                        seed: int, lr: float, eps: float, weight_decay: float, steps: int,
                        flush: bool = True) -> list[Losses]:
    """The deferred-update schedule on `parts` + `flats` (updated in place; at the end
    the resident modules hold the trained resident weights); batches[step] (or
    batches(step)) gives the input ids or a zoexec.data.batch.Batch (its labels and
    choices: the loss the engine computes, zoexec.model.heads). Returns (l+, l-, g)."""
    with torch.no_grad():
        st = _Zo2State(parts)
        history: list[Losses] = []
        pending: tuple[int, float] | None = None
        for step in range(steps):
            s = zo.step_seed(seed, step)
            record = _zo2_step(parts, st, flats, _batch_at(batches, step), seed=s,
                               pending=pending, lr=lr, eps=eps, weight_decay=weight_decay)
            history.append(record)
            pending = (s, record[2])
        if flush and pending is not None:
            flush_pending(parts, st.resident, flats, pending, lr=lr, weight_decay=weight_decay)
        bind_resident(parts, st.resident)
        bind_block(parts, flats[0].to(parts.dtype, copy=True))
        return history


def peft_lora_model(model: torch.nn.Module, *, seed: int, r: int, alpha: int,
                    targets: tuple[str, ...]) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, int, int]]]:
    """`model` wrapped by peft with LoRA on `targets`, its adapters set to the ones
    zoexec.model.lora.init_adapters draws for run seed `seed`. Returns (peft model,
    [(parameter, block, tensor index)] of the adapters in the z addressing)."""
    from peft import LoraConfig, get_peft_model

    adapter = adapter_for(model.config)
    layers, prefix = adapter.get_layers(model), adapter.layer_prefix
    spec = lora_spec(layers[0], r=r, alpha=alpha, targets=tuple(targets))
    wrapped = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                               lora_dropout=0.0, task_type="CAUSAL_LM"))
    params = {name.replace(".default.", "."): p for name, p in wrapped.named_parameters()
              if "lora_" in name}
    addresses: list[tuple[torch.Tensor, int, int]] = []
    for block in range(len(layers)):
        flat = init_adapters(spec, seed=seed, block=block, out=torch.empty(spec.numel))
        for index, tensor in enumerate(spec.specs):
            param = params[peft_key(prefix, block, tensor.name)]
            with torch.no_grad():
                param.copy_(flat[tensor.offset:tensor.stop].view(tensor.shape))
            addresses.append((param, block, index))
    return wrapped.eval(), addresses


def lora_reference_train(model: torch.nn.Module, batches: Batches, *, seed: int, lr: float,
                         eps: float, weight_decay: float, steps: int, r: int, alpha: int,
                         targets: tuple[str, ...]) -> tuple[torch.nn.Module, list[Losses]]:
    """Plain MeZO-SGD over LoRA adapters (module docstring) of the HF model `model`;
    returns (the peft model, [(loss_plus, loss_minus, g)] per step)."""
    with torch.no_grad():
        wrapped, addresses = peft_lora_model(model, seed=seed, r=r, alpha=alpha, targets=targets)
        named = [(None, p, b, i) for p, b, i in addresses]
        history: list[Losses] = []
        for step in range(steps):
            ids, s = _batch_at(batches, step), zo.step_seed(seed, step)
            _perturb_model(named, s, eps)
            loss_plus = float(wrapped(input_ids=ids, labels=ids).loss)
            _perturb_model(named, s, -2 * eps)
            loss_minus = float(wrapped(input_ids=ids, labels=ids).loss)
            _perturb_model(named, s, eps)
            g = zo.projected_grad(loss_plus, loss_minus, eps)
            _update_model(named, s, lr=lr, g=g, weight_decay=weight_decay)
            history.append((loss_plus, loss_minus, g))
        return wrapped, history


# ---- the estimators, written plainly ------------------------------------------------------------
def plain_direction(spec: EstimatorSpec, *, run_seed: int, seed: int, step: int, block: int,
                    specs: Sequence[TensorSpec], theta: torch.Tensor) -> torch.Tensor:
    """d of a block as zoplan.estimators defines it, tensor by tensor and whole (no tiles,
    no ranges, no kept thresholds): z per tensor (zo.z_tensor); lowrank: U V^T / sqrt(r)
    of each matrix (U from the direction's seed, V from the seed of its period of
    `lowrank_every` steps); sparse: z where |theta| is at most the share-quantile of
    every SPARSE_STRIDE-th |theta| of the tensor."""
    out = torch.zeros(theta.numel(), dtype=torch.float32)
    for index, t in enumerate(specs):
        if spec.estimator == "lowrank" and is_matrix(t.shape):
            u, v = lowrank_factors(seed, mix_seed(run_seed, LOWRANK_V, step // spec.lowrank_every),
                                   block, index, t.shape, spec.lowrank_rank)
            out[t.offset:t.stop] = (u @ v.T).view(-1)
            continue
        z = zo.z_tensor(seed, block, index, (t.numel,))
        if spec.estimator == "sparse":
            weights = theta[t.offset:t.stop].abs().float()
            sample = weights[::SPARSE_STRIDE].sort().values
            h = sample[max(1, math.ceil(spec.sparse_share * sample.numel())) - 1]
            z = torch.where(weights <= h, z, torch.zeros_like(z))
        out[t.offset:t.stop] = z
    return out


def _plain_update(theta: torch.Tensor, specs: Sequence[TensorSpec], block: int,
                  pending: PlainPending, *, estimator: EstimatorSpec, run_seed: int,
                  weight_decay: float) -> None:
    """The deferred update (step, seed, lr, gs) of a step on one flat buffer."""
    step, seed, lr, gs = pending
    q = len(gs)
    for j, g in enumerate(gs):
        d = plain_direction(estimator, run_seed=run_seed, seed=zo.mix_seed(seed, DIRECTION_TAG, j)
                            if j else seed, step=step, block=block, specs=specs, theta=theta)
        zo.apply_update(theta, d.to(theta.dtype), lr=lr, g=g if q == 1 else g / q,
                        weight_decay=weight_decay if j == 0 else 0.0, decay_mask_or_specs=specs)


def _plain_losses(parts: ModelParts, resident: torch.Tensor, flats: Sequence[torch.Tensor],
                  batch: Batch, *, estimator: EstimatorSpec, run_seed: int, seed: int, step: int,
                  eps: float) -> tuple[float, float, int]:
    """(summed l+, summed l-, count) of one direction (seed) on `batch`."""
    d_r = plain_direction(estimator, run_seed=run_seed, seed=seed, step=step,
                          block=zo.RESIDENT_BLOCK, specs=parts.resident_specs, theta=resident)
    ds = [plain_direction(estimator, run_seed=run_seed, seed=seed, step=step, block=b,
                          specs=parts.block_specs, theta=theta) for b, theta in enumerate(flats)]
    out: list[float] = []
    for sign in (1.0, -1.0):
        bind_resident(parts, zo.perturb_into(torch.empty_like(resident), resident, d_r, sign * eps))
        hidden, ctx = parts.embed(batch.ids)
        for theta, d in zip(flats, ds, strict=True):
            bind_block(parts, zo.perturb_into(torch.empty(theta.numel(), dtype=parts.dtype),
                                              theta, d, sign * eps))
            hidden = parts.block_forward(hidden, ctx)
        total, count = heads.loss_sum(parts, hidden, batch)
        out.append(float(total))
    return out[0], out[1], count


def estimator_reference_train(parts: ModelParts, flats: list[torch.Tensor], batches: Batches, *,
                              seed: int,
                              lr: float, eps: float, weight_decay: float, steps: int,
                              estimator: EstimatorSpec) -> list[tuple[float, float, tuple[float, ...]]]:
    """The deferred-update schedule with an estimator (zoplan.estimators.EstimatorSpec)
    written plainly (plain_direction; q directions: direction j on the j-th of q equal
    parts of the batch, theta -= lr * (1/q) sum_j g_j d_j), fp32 flats updated in place
    and flushed at the end, the resident parts bound. Returns (l+, l-, gs) per step."""
    with torch.no_grad():
        resident, q = resident_flat(parts), estimator.directions
        history: list[tuple[float, float, tuple[float, ...]]] = []
        pending: PlainPending | None = None
        update = functools.partial(_plain_update, estimator=estimator, run_seed=seed,
                                   weight_decay=weight_decay)
        for step in range(steps):
            if pending is not None:
                update(resident, parts.resident_specs, zo.RESIDENT_BLOCK, pending)
                for b, theta in enumerate(flats):
                    update(theta, parts.block_specs, b, pending)
            s, batch = zo.step_seed(seed, step), as_batch(_batch_at(batches, step))
            k, per = batch.per_example, batch.rows // batch.per_example // q
            sums = [_plain_losses(parts, resident, flats, batch.select(j * per * k, (j + 1) * per * k)
                                  if q > 1 else batch, estimator=estimator, run_seed=seed,
                                  seed=zo.mix_seed(s, DIRECTION_TAG, j) if j else s, step=step, eps=eps)
                    for j in range(q)]
            count = sum(c for _, _, c in sums)
            gs = tuple(zo.projected_grad(lp / c, lm / c, eps) for lp, lm, c in sums)
            history.append((sum(x[0] for x in sums) / count, sum(x[1] for x in sums) / count, gs))
            pending = (step, s, lr, gs)
        if pending is not None:
            update(resident, parts.resident_specs, zo.RESIDENT_BLOCK, pending)
            for b, theta in enumerate(flats):
                update(theta, parts.block_specs, b, pending)
        bind_resident(parts, resident)
        return history
