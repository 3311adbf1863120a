"""Small file helpers shared by every artifact: atomic writes and JSON loading with
one-line errors. An output file is either whole or absent, never half-written."""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError, first_line


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def usual_mode(path: Path | str) -> None:
    """Give a file zoexec or zoplan wrote the mode the user's umask gives a new file
    (0644 under the usual 022; libraries that write through a temporary file leave 0600),
    a folder the mode it gives a new folder."""
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_UMASK, follow_symlinks=False)


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


def check_writable(path: Path | str, *, what: str = "",
                   inputs: tuple[str | Path | None, ...] = ()) -> None:
    """ZoError (one line) unless `path` can be written as a file: its folder exists and
    takes files (a file is made there and removed: a read-only, full or refusing file
    system says so now, whoever runs it), `path` itself is not a folder or another kind
    of file, nor one of the command's `inputs` (a plan written over its profile, a
    lengths file over its data). Called before long work, so a bad output path fails
    at once."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    name = f"{what} {path}".strip()
    try:
        if not parent.is_dir():
            raise ZoError(f"cannot write {name}: folder {parent} does not exist")
        if path.exists() and not path.is_file():
            raise ZoError(f"cannot write {name}: it exists and is not a regular file")
        if len(path.name.encode()) > 255:
            raise ZoError(f"cannot write {name}: File name too long")
        for given in inputs:
            if given is not None and path.exists() and Path(given).exists() \
                    and os.path.samefile(path, given):
                raise ZoError(f"cannot write {name}: it is the input {given}, which it would replace")
        fd, probe = tempfile.mkstemp(prefix=".zo-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ZoError(f"cannot write {name}: {exc.strerror or exc}") from None


def dumps_canonical(data: Any) -> str:
    """Deterministic JSON text (sorted keys, fixed indent): same input, same bytes."""
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_json(data: Any) -> str:
    return sha256_text(json.dumps(data, sort_keys=True, separators=(",", ":")))


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(path: Path | str) -> str:
    """What `path` is, in words, following links: "a file" (a regular one), "a folder",
    "a FIFO (named pipe)", "a character device" (/dev/zero), "a block device", "a
    socket", or "missing" (nothing there, or a link to nothing)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:   # a loop of links, a name too long, no permission
        raise ZoError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in _SPECIAL if test(mode)), "not a regular file")


def need_file(path: Path | str, *, what: str = "file") -> Path:
    """`path`, if it is a regular file (following links); else ZoError naming what it is:
    a FIFO, a device or a socket is refused before it is opened (reading one would hang
    or never end)."""
    path = Path(path)
    kind = kind_of(path)
    if kind == "missing":
        raise ZoError(f"{what} {path} does not exist")
    if kind != "a file":
        raise ZoError(f"{what} {path} is {kind}, not a regular file")
    return path


def need_tree(folder: Path | str, *, what: str = "folder") -> Path:
    """`folder`, if everything in it is a regular file or a folder (following links);
    else ZoError naming the first other thing (a FIFO, a device, a socket)."""
    folder = Path(folder)
    for item in sorted(folder.rglob("*")):
        kind = kind_of(item)
        if kind not in ("a file", "a folder"):
            raise ZoError(f"{what} {folder}: {item} is {kind}, not a regular file")
    return folder


def need_folder(folder: Path | str, *, what: str = "folder") -> Path:
    """`folder`, if it is a folder whose files are all regular files (links followed);
    else ZoError naming what it is, or the FIFO, device or socket in it (reading one
    would hang), before any file of it is opened (a model, adapter or data folder)."""
    folder = Path(folder)
    kind = kind_of(folder)
    if kind != "a folder":
        raise ZoError(f"{what} {folder} " + ("does not exist" if kind == "missing"
                                            else f"is {kind}, not a folder"))
    return need_tree(folder, what=what)


def need_input(path: Path | str, *, what: str) -> Path:
    """`path`, if it is a regular file or a folder of them (data: a file or a
    save_to_disk folder); else ZoError naming what it is (need_file, need_folder)."""
    return need_folder(path, what=what) if kind_of(path) == "a folder" else need_file(path, what=what)


def sha256_file(path: Path | str) -> str:
    """sha256 of a regular file's bytes, read in chunks (need_file first)."""
    digest = hashlib.sha256()
    with need_file(path).open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_path(path: Path | str) -> str:
    """sha256 of a data file, or of a folder (a save_to_disk data set): each file's
    relative name and sha256, in name order. The one content hash of data, in run.json's
    inputs and in a lengths file alike."""
    path = Path(path)
    if not path.is_dir():
        return sha256_file(need_file(path, what="data"))
    digest = hashlib.sha256()
    for item in sorted(p for p in need_tree(path, what="data").rglob("*") if p.is_file()):
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


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):   # 1e999: a literal too large for a float
        raise NotFinite(text)
    return value


def loads_strict(text: str | bytes) -> Any:
    """json.loads that refuses NaN and the infinities (NotFinite, a ValueError), also
    written as a literal too large for a float (1e999), and nesting too deep for the
    parser (a JSONDecodeError): every JSON text the tools read goes through it."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:   # arrays or objects nested thousands deep
        raise _not_json("nested too deeply") from None
    except (json.JSONDecodeError, NotFinite):
        raise
    except ValueError as exc:   # an integer of more digits than Python converts
        raise _not_json(first_line(exc).split(";")[0]) from None


def _not_json(message: str) -> json.JSONDecodeError:
    """A JSONDecodeError that reads as `message` alone (no line and column: the whole
    text is at fault)."""
    exc = json.JSONDecodeError(message, "", 0)
    exc.args = (message,)
    return exc


def load_json(path: Path | str, *, what: str = "file") -> Any:
    """Load a JSON file or raise ZoError naming the file and the problem. NaN and
    Infinity (which Python's json module accepts, and strict JSON does not) are refused:
    no figure of a plan, profile or trace may be non-finite."""
    path = need_file(path, what=what)
    try:
        return loads_strict(path.read_text())
    except NotFinite as exc:
        raise ZoError(f"{what} {path} holds {exc.name}, which is not a finite number") from None
    except json.JSONDecodeError as exc:
        raise ZoError(f"{what} {path} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ZoError(f"{what} {path} is not a text file ({not_utf8(exc)})") from None
    except OSError as exc:
        raise ZoError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def not_utf8(exc: UnicodeDecodeError, *, offset: int = 0) -> str:
    """Where a text is not UTF-8, in words: "byte 0xff at byte offset 1234 is not UTF-8"
    (`offset`: where the decoded bytes start in their file)."""
    return f"byte {exc.object[exc.start]:#04x} at byte offset {offset + exc.start} is not UTF-8"
