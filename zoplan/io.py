"""Small file helpers shared by every artifact: atomic writes and JSON loading with
one-line errors. An output file is either whole or absent, never half-written."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write_text(path: Path | str, text: str, *, what: str = "") -> None:
    """Write `text` to `path` through a temporary file in the same folder + rename; an
    OS refusal is one ZoError line ("cannot write <what> <path>: ...")."""
    path = Path(path)
    name = f"{what} {path}".strip()
    try:
        if path.parent and not path.parent.exists():
            raise ZoError(f"cannot write {name}: folder {path.parent} does not exist")
        if path.is_dir():
            raise ZoError(f"cannot write {name}: it is a folder")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", dir=path.parent or ".")
    except OSError as exc:
        raise ZoError(f"cannot write {name}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual mode
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ZoError(f"cannot write {name}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: Path | str, *, what: str = "") -> None:
    """ZoError (one line) unless `path` can be written as a file: its folder exists and
    takes files, and `path` itself is not a folder or another kind of file. Called
    before long work, so a bad output path fails at once."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    name = f"{what} {path}".strip()
    try:
        if not parent.is_dir():
            raise ZoError(f"cannot write {name}: folder {parent} does not exist")
        if path.exists() and not path.is_file():
            raise ZoError(f"cannot write {name}: it exists and is not a regular file")
        if not os.access(parent, os.W_OK):
            raise ZoError(f"cannot write {name}: folder {parent} is not writable")
        if len(path.name.encode()) > 255:
            raise ZoError(f"cannot write {name}: File name too long")
    except OSError as exc:
        raise ZoError(f"cannot write {name}: {exc.strerror or exc}") from None


def dumps_canonical(data: Any) -> str:
    """Deterministic JSON text (sorted keys, fixed indent): same input, same bytes."""
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_json(data: Any) -> str:
    return sha256_text(json.dumps(data, sort_keys=True, separators=(",", ":")))


def sha256_file(path: Path | str) -> str:
    """sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_path(path: Path | str) -> str:
    """sha256 of a data file, or of a folder (a save_to_disk data set): each file's
    relative name and sha256, in name order. The one content hash of data, in run.json's
    inputs and in a lengths file alike."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(item.relative_to(path)).encode() + b"\0")
        digest.update(bytes.fromhex(sha256_file(item)))
    return digest.hexdigest()


class NotFinite(ValueError):
    """NaN, Infinity or -Infinity in a JSON text (Python's json module accepts them,
    strict JSON does not)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not a finite number")
        self.name = name


def _refuse_constant(name: str) -> float:
    raise NotFinite(name)


def loads_strict(text: str) -> Any:
    """json.loads that refuses NaN and the infinities (NotFinite, a ValueError): every
    JSON text the tools read goes through it."""
    return json.loads(text, parse_constant=_refuse_constant)


def load_json(path: Path | str, *, what: str = "file") -> Any:
    """Load a JSON file or raise ZoError naming the file and the problem. NaN and
    Infinity (which Python's json module accepts, and strict JSON does not) are refused:
    no figure of a plan, profile or trace may be non-finite."""
    path = Path(path)
    if not path.exists():
        raise ZoError(f"{what} {path} does not exist")
    if not path.is_file():
        raise ZoError(f"{what} {path} is not a file")
    try:
        return loads_strict(path.read_text())
    except NotFinite as exc:
        raise ZoError(f"{what} {path} holds {exc.name}, which is not a finite number") from None
    except json.JSONDecodeError as exc:
        raise ZoError(f"{what} {path} is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ZoError(f"{what} {path} is not a text file") from None
