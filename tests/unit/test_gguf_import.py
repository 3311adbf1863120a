"""`zoexec import-gguf`: a tiny Llama written to GGUF as llama.cpp writes one (the gguf
package's GGUFWriter, q/k rows permuted, optionally q8_0) comes back as an HF folder
with the same weights and the same forward; bad files get one error line, exit 2, and
leave no folder behind."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.model.export import hf_tensors
from zoexec.model.families import bind_block, bind_resident, resident_flat
from zoexec.model.gguf_import import import_gguf
from zoexec.store.loading import build_parts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from gguf_file import write_bare_gguf, write_llama_gguf  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    """tiny-llama's init plus noise (norms away from 1), its state dict copied."""
    parts, flats = build_parts("tiny-llama", seed=7)
    gen = torch.Generator().manual_seed(7)
    for flat in flats:
        flat.add_(torch.randn(flat.shape, generator=gen) * 0.05)
    resident = resident_flat(parts)
    resident.add_(torch.randn(resident.shape, generator=gen) * 0.05)
    bind_resident(parts, resident)
    return parts, flats, {k: t.clone() for k, t in hf_tensors(parts, flats)}


def _logits(parts, flats, ids):
    with torch.no_grad():
        hidden, ctx = parts.embed(ids)
        for flat in flats:
            bind_block(parts, flat.clone())
            hidden = parts.block_forward(hidden, ctx)
        return parts.logits(hidden)


def test_an_f32_gguf_comes_back_with_the_same_weights_and_forward(llama, tmp_path):
    parts, flats, state = llama
    path = write_llama_gguf(tmp_path / "m.gguf", state, parts.config)
    result = CliRunner().invoke(app, ["import-gguf", str(path), "-o", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert model.dtype == torch.float32 and type(model).__name__ == "LlamaForCausalLM"
    for name, tensor in model.state_dict().items():
        if "rotary" not in name:
            assert torch.equal(tensor, state[name]), name
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, _logits(parts, flats, ids), rtol=1e-5, atol=1e-5)
    again, flats2 = build_parts("tiny-llama", init=str(tmp_path / "hf"))   # zoexec reads it
    assert all(torch.equal(a, b) for a, b in zip(flats, flats2, strict=True))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.convert_tokens_to_ids(["<s>", "hello"]) == [0, 4]


def test_a_q8_0_gguf_dequantises_to_the_quantised_weights(llama, tmp_path):
    import gguf

    parts, flats, state = llama
    path = write_llama_gguf(tmp_path / "q.gguf", state, parts.config, qtype="Q8_0")
    out = import_gguf(path, tmp_path / "hf", dtype="fp32")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, tensor in model.state_dict().items():
        if "rotary" in name:
            continue
        want = state[name].numpy()
        if want.ndim == 2:    # what llama.cpp's q8_0 keeps of it (q/k rows permute alike)
            want = gguf.quants.dequantize(gguf.quants.quantize(want, q8), q8)
        torch.testing.assert_close(tensor, torch.from_numpy(np.asarray(want)), rtol=0, atol=1e-6,
                                   msg=name)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, _logits(parts, flats, ids), rtol=0, atol=0.1)   # q8_0 error


def _error(args):
    result = CliRunner().invoke(app, ["import-gguf", *map(str, args)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_bad_files_get_one_error_line_and_no_folder(llama, tmp_path):
    import gguf

    out = tmp_path / "hf"
    assert "does not exist" in _error([tmp_path / "none.gguf", "-o", out])
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not gguf")
    assert "is not a GGUF file" in _error([tmp_path / "x.gguf", "-o", out])
    write_bare_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    assert "architecture 'rwkv6' is not one transformers reads" in _error([tmp_path / "rwkv.gguf", "-o", out])
    write_bare_gguf(tmp_path / "phi3.gguf", "phi3")
    assert "model_type 'phi3' is not supported" in _error([tmp_path / "phi3.gguf", "-o", out])
    parts, _, state = llama
    good = write_llama_gguf(tmp_path / "m.gguf", state, parts.config)
    assert "--dtype 'fp8'" in _error([good, "-o", out, "--dtype", "fp8"])
    q81 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q81]
    write_bare_gguf(tmp_path / "q81.gguf", "llama",
                    raw={"token_embd.weight": (np.zeros((4, 64 // block * size), np.uint8), q81)})
    assert "quantised as Q8_1, which the gguf package cannot dequantise" in _error(
        [tmp_path / "q81.gguf", "-o", out])
    assert not out.exists() and not list(tmp_path.glob(".hf*"))
    out.mkdir()
    assert "exists" in _error([good, "-o", out])
