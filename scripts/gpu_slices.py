"""The update on the slice's maths on one device (Layout.slice_update, which one GPU
cannot run as a layout: it needs a slice group): for 2 and 8 slices of one block, z of
each slice (zoexec.maths.zo.z_range, cut chunks through one chunk of scratch) and the
slice's update in the 16-bit stored precision (round to nearest and stochastic) equal
the whole block's, bit for bit; the z time of a slice. Used by scripts/gpu_check.py."""

from __future__ import annotations

import time

import torch

from zoexec.maths.zo import apply_update, apply_update_stochastic, z_block, z_range
from zoexec.model.families import torch_dtype
from zoexec.store.loading import build_parts
from zoplan.execrules import z_chunk
from zoplan.memory import store_stride
from zoplan.models import get_model


def check_slices(model: str, precision: str, device_kind: str) -> dict:
    spec = get_model(model)
    config = {k: v for k, v in spec.hf_config.items() if k != "layer_types"}
    parts, flats = build_parts({**config, "num_hidden_layers": 1}, param_dtype=precision,
                               compute_dtype=precision)
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    specs, numel, dtype = parts.block_specs, parts.block_numel, torch_dtype(precision)
    whole = z_block(7, 0, specs, out=torch.empty(numel, dtype=dtype, device=device))
    update = dict(lr=1e-3, g=3.0, weight_decay=0.1, seed=7, block=0)
    theta0 = flats[0].to(device=device, dtype=dtype)
    expect = {"plain": apply_update(theta0.clone(), whole, lr=1e-3, g=3.0, weight_decay=0.1,
                                    decay_mask_or_specs=specs),
              "stochastic": apply_update_stochastic(theta0.clone(), whole, specs=specs, **update)}
    edge = torch.empty(min(z_chunk(device.type), max(s.numel for s in specs)), dtype=dtype,
                       device=device)
    out = {"block_params": numel}
    for slices in (2, 8):
        size = store_stride(numel, slices=slices, local_ranks=slices) // slices
        same, times = True, []
        for index in range(slices):
            start, stop = index * size, min(numel, (index + 1) * size)
            sync()
            began = time.perf_counter()
            z = z_range(7, 0, specs, start, stop, out=torch.empty(stop - start, dtype=dtype,
                                                                  device=device), scratch=edge)
            sync()
            times.append(time.perf_counter() - began)
            same &= torch.equal(z, whole[start:stop])
            for name, want in expect.items():
                piece = theta0[start:stop].clone()
                if name == "plain":
                    apply_update(piece, z, lr=1e-3, g=3.0, weight_decay=0.1,
                                 decay_mask_or_specs=specs, start=start)
                else:
                    apply_update_stochastic(piece, z, specs=specs, start=start, **update)
                same &= torch.equal(piece, want[start:stop])
        out[f"slices{slices}_same_bits"] = bool(same)
        out[f"slices{slices}_z_s"] = max(times)
    return out
