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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from zoexec.data.batch import as_batch
from zoexec.maths import zo
from zoexec.model import heads
from zoexec.model.families import (
    ModelParts,
    adapter_for,
    bind_block,
    bind_resident,
    param_addresses,
    resident_flat,
)
from zoexec.model.lora import init_adapters, lora_spec, peft_key


def _batch_at(batches, step: int) -> torch.Tensor:
    return batches(step) if callable(batches) else batches[step]


def _perturb_model(addresses, seed: int, scale: float) -> None:
    for _, param, block, index in addresses:
        param.add_(zo.z_tensor(seed, block, index, param.shape, device=param.device), alpha=scale)


def _update_model(addresses, seed: int, *, lr: float, g: float, weight_decay: float) -> None:
    for _, param, block, index in addresses:
        z = zo.z_tensor(seed, block, index, param.shape, device=param.device)
        wd = weight_decay if param.dim() >= 2 else 0.0
        param.sub_(lr * (g * z + wd * param))


@torch.no_grad()
def mezo_reference_train(model, batches: Sequence | Callable, *, seed: int, lr: float,
                         eps: float, weight_decay: float, steps: int) -> list[tuple[float, float, float]]:
    """Train `model` (an HF *ForCausalLM, modified in place) with plain MeZO-SGD for
    `steps` steps; batches[step] (or batches(step)) gives the input ids. Returns the
    (loss_plus, loss_minus, g) of each step."""
    model.eval()
    addresses = param_addresses(model)
    history = []
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


def _refresh(theta, z_out, specs, block: int, *, seed: int, pending, lr, weight_decay):
    """Apply the pending (seed, g) update to theta, then draw this step's z into z_out."""
    if pending is not None:
        prev_seed, prev_g = pending
        zo.z_block(prev_seed, block, specs, out=z_out)
        zo.apply_update(theta, z_out, lr=lr, g=prev_g, weight_decay=weight_decay,
                        decay_mask_or_specs=specs)
    return zo.z_block(seed, block, specs, out=z_out)


def _resident_call(parts, st: _Zo2State, eps: float, fn):
    """Run fn under resident weights +eps*z, then -eps*z: (fn(+), fn(-))."""
    out = []
    for scale in (eps, -eps):
        zo.perturb_into(st.resident_work, st.resident, st.resident_z, scale)
        out.append(fn())
    return out


def _zo2_step(parts, st, flats, batch, *, seed, pending, lr, eps, weight_decay):
    batch = as_batch(batch)
    ids = batch.ids
    kw = dict(pending=pending, lr=lr, weight_decay=weight_decay)
    _refresh(st.resident, st.resident_z, parts.resident_specs, zo.RESIDENT_BLOCK, seed=seed, **kw)
    bind_resident(parts, st.resident_work)
    (h_plus, ctx), (h_minus, _) = _resident_call(parts, st, eps, lambda: parts.embed(ids))
    bind_block(parts, st.block_work)
    for block, theta in enumerate(flats):
        z = _refresh(theta, st.block_z, parts.block_specs, block, seed=seed, **kw)
        zo.perturb_into(st.block_work, theta, z, eps)
        h_plus = parts.block_forward(h_plus, ctx)
        zo.perturb_into(st.block_work, theta, z, -eps)
        h_minus = parts.block_forward(h_minus, ctx)
    losses = iter((h_plus, h_minus))
    loss_plus, loss_minus = _resident_call(parts, st, eps, lambda: _loss(parts, next(losses), batch))
    return loss_plus, loss_minus, zo.projected_grad(loss_plus, loss_minus, eps)


def _loss(parts, hidden, batch) -> float:
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


@torch.no_grad()
def zo2_reference_train(parts: ModelParts, flats: list[torch.Tensor], batches, *, seed: int,
                        lr: float, eps: float, weight_decay: float, steps: int,
                        flush: bool = True) -> list[tuple[float, float, float]]:
    """The deferred-update schedule on `parts` + `flats` (updated in place; at the end
    the resident modules hold the trained resident weights); batches[step] (or
    batches(step)) gives the input ids or a zoexec.data.batch.Batch (its labels and
    choices: the loss the engine computes, zoexec.model.heads). Returns (l+, l-, g)."""
    st = _Zo2State(parts)
    history, pending = [], None
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


def peft_lora_model(model, *, seed: int, r: int, alpha: int, targets: tuple[str, ...]):
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
    addresses = []
    for block in range(len(layers)):
        flat = init_adapters(spec, seed=seed, block=block, out=torch.empty(spec.numel))
        for index, tensor in enumerate(spec.specs):
            param = params[peft_key(prefix, block, tensor.name)]
            with torch.no_grad():
                param.copy_(flat[tensor.offset:tensor.stop].view(tensor.shape))
            addresses.append((param, block, index))
    return wrapped.eval(), addresses


@torch.no_grad()
def lora_reference_train(model, batches: Sequence | Callable, *, seed: int, lr: float, eps: float,
                         weight_decay: float, steps: int, r: int, alpha: int,
                         targets: tuple[str, ...]):
    """Plain MeZO-SGD over LoRA adapters (module docstring) of the HF model `model`;
    returns (the peft model, [(loss_plus, loss_minus, g)] per step)."""
    wrapped, addresses = peft_lora_model(model, seed=seed, r=r, alpha=alpha, targets=targets)
    named = [(None, p, b, i) for p, b, i in addresses]
    history = []
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
