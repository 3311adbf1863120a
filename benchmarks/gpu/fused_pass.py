"""The fused ZO pass (zoexec.maths.fused) measured: what the CPU can show and, on a GPU,
its time against the torch path's. Prints figures; not a test.

    .venv/bin/python benchmarks/gpu/fused_pass.py [--samples 1048576] [--compile]
                                                  [--model opt-1.3b] [--reps 20]

Always (CPU): the counter Gaussian against fp64's own Box-Muller of the same uniforms
(largest difference) and a standard normal (mean, variance, skew, kurtosis, largest
|z|). With --compile: the kernel compiled for sm_80 and sm_90 on this machine (Triton
needs no GPU for it): the PTX's fma.rn.f32 (0: no contraction), div.rn and sqrt.rn
counts. On CUDA: one block of --model (bf16 weights, stochastic rounding): the fused
update + first perturbation and the second perturbation against the torch path's
(z drawn twice, apply_update_stochastic, two perturb_into), in ms, the fused pass's HBM
bytes over its time, and whether the GPU's fused bits equal the counter maths in plain
torch on the same GPU and on the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from zoexec.maths import counter as cm  # noqa: E402


def gaussian_figures(samples: int) -> None:
    index = torch.arange(samples, dtype=torch.int64)
    w = cm.philox(index, cm.counter_key(1, 0, 0))
    z = cm.gaussian(w[0], w[1]).double()
    u = ((w[0] >> 9) * 2 + 1).double() * 2.0 ** -24
    angle = (w[1] >> 30).double() + (((w[1] >> 7) & 0x7FFFFF) * 2 + 1).double() * 2.0 ** -24
    exact = torch.sqrt(-2 * torch.log(u)) * torch.cos(angle * math.pi / 2)
    se = 1 / math.sqrt(samples)
    print(f"counter Gaussian, {samples:,} samples (seed 1, block 0, tensor 0)")
    print(f"  largest |z - fp64 Box-Muller of the same uniforms|: {(z - exact).abs().max():.3g}")
    print(f"  mean {z.mean():+.5f} (standard error {se:.5f}), variance {z.var():.5f} "
          f"(se {math.sqrt(2) * se:.5f}), skew {(z ** 3).mean():+.5f} (se {math.sqrt(15) * se:.5f}),"
          f" kurtosis {(z ** 4).mean():.5f} (normal: 3, se {math.sqrt(96) * se:.5f})")
    print(f"  largest |z| {z.abs().max():.4f} (bound sqrt(48 ln 2) = {math.sqrt(48 * math.log(2)):.4f})")


def compile_figures() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zoexec.maths import fused

    fn = fused._zo_pass
    types = dict(theta="*i16", work="*i16", count="i32", start="i32", table="*i64",
                 decays="*i8", num_tensors="i32", uh0="i32", uh1="i32", alpha="fp32",
                 shrink="fp32", ph0="i32", ph1="i32", scale="fp32")
    consts = dict(UPDATE=True, DECAY=True, STEP=True, PERTURB=True, THETA=fused.BF16,
                  WORK=fused.BF16, STOCHASTIC=True, N=fused.BLOCK)
    signature = {**types, **{k: "constexpr" for k in consts}}
    constexprs = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    for cap in (80, 90):
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                target=GPUTarget("cuda", cap, 32),
                                options={"enable_fp_fusion": False})
        ptx = kernel.asm["ptx"]
        print(f"sm_{cap} (triton {triton.__version__}, bf16 update + perturbation): "
              f"fma.rn.f32 {ptx.count('fma.rn.f32')}, div.rn.f32 {ptx.count('div.rn.f32')}, "
              f"sqrt.rn.f32 {ptx.count('sqrt.rn.f32')}, mul.hi.u32 {ptx.count('mul.hi.u32')}")


def block_specs(model: str) -> list:
    """Specs of one block of a catalogue model, built on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    from zoexec.model.families import _config_from, adapter_for, make_specs

    config = _config_from(model, "random")
    config.num_hidden_layers = 1
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    return make_specs(list(adapter_for(config).get_layers(hf)[0].named_parameters()))


def _ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def gpu_block(model: str, reps: int) -> None:
    """The fused pass against the torch path on one block of `model` (CUDA)."""
    from zoexec.maths import fused, zo

    dev = torch.device("cuda")
    specs = block_specs(model)
    n = specs[-1].offset + specs[-1].numel
    theta = (torch.randn(n, device=dev) * 0.02).bfloat16()
    work = torch.empty_like(theta)
    z = torch.empty(n, dtype=torch.bfloat16, device=dev)
    terms = [cm.Term.of(seed=11, lr=1e-6, g=3.0, weight_decay=0.1)]
    up = cm.Perturb(seed=12, scale=1e-3, out=work)
    down = cm.Perturb(seed=12, scale=-1e-3, out=work)

    def fused_step() -> None:
        fused.fused_pass(theta, specs=specs, block=0, terms=terms, perturb=up)
        fused.fused_pass(theta, specs=specs, block=0, terms=[], perturb=down)

    def torch_step() -> None:
        zo.z_block(11, 0, specs, out=z)
        zo.apply_update_stochastic(theta, z, lr=1e-6, g=3.0, weight_decay=0.1, specs=specs,
                                   seed=11, block=0)
        zo.z_block(12, 0, specs, out=z)
        zo.perturb_into(work, theta, z, 1e-3)
        zo.perturb_into(work, theta, z, -1e-3)

    fused_ms, torch_ms = _ms(fused_step, reps), _ms(torch_step, reps)
    moved = 10 * n   # bf16: read theta twice, write theta once, write work twice
    print(f"{model} block, {n:,} bf16 weights, {len(specs)} tensors on "
          f"{torch.cuda.get_device_name(dev)}")
    print(f"  fused (update + perturbation, second perturbation): {fused_ms:.3f} ms, "
          f"2 launches, {moved / fused_ms / 1e6:.0f} GB/s of HBM traffic")
    print(f"  torch path (2 z draws, stochastic update, 2 perturb_into): {torch_ms:.3f} ms")
    small = theta[:1 << 20].clone()
    spec = [type(specs[0])(name="w", shape=(small.numel(),), numel=small.numel(), offset=0,
                           decay=True)]
    ours = small.clone()
    fused.fused_pass(ours, specs=spec, block=0, terms=terms)
    plain = small.clone()
    cm.counter_pass(plain, specs=spec, block=0, terms=terms)
    cpu = small.cpu()
    cm.counter_pass(cpu, specs=spec, block=0, terms=terms)
    print(f"  fused == counter on this GPU: {torch.equal(ours, plain)}; fused (GPU) == counter "
          f"(CPU): {torch.equal(ours.cpu(), cpu)} (2^20 weights)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1 << 20)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--model", default="opt-1.3b")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    gaussian_figures(args.samples)
    if args.compile and os.environ.get("TRITON_INTERPRET") != "1":
        compile_figures()
    if torch.cuda.is_available():
        gpu_block(args.model, args.reps)
    else:
        print("no CUDA device: the GPU timing is left for a GPU machine")


if __name__ == "__main__":
    main()
