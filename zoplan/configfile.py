"""Options from a file: `--config FILE` (YAML or JSON, one mapping of option names to
values) read into {field: value}, and `--print-config` writing one back; both
`zoplan optimize` (typed here: field_values) and `zoexec run` (read_config: the values
as the file gives them, zoexec.flags types them) read it.

Torch-free and independent of any command: a command gives the names it accepts
(`names`: each spelling -> its field, e.g. {"lora-r": "lora_r", "lora_r": "lora_r"}) and
each field's type; a key of the file outside them is refused in one line naming the
nearest valid one (difflib), a value of the wrong type in one line naming its key.
The command line overrides the file (the caller merges: file first, then what was
given). A contract: zoexec may import it (tests/unit/test_import_rules.py).

    names = {"batch": "batch", "lora-r": "lora_r", ...}
    values = read_options("plan.yaml", names, {"batch": int, "lora_r": int, ...})
"""

from __future__ import annotations

import difflib
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, need_file

SUFFIXES = (".yaml", ".yml", ".json")


def read_mapping(path: str | Path, *, what: str = "--config") -> dict[str, Any]:
    """The file's one mapping (YAML, or JSON: a .json file is read as JSON, anything else
    as YAML, which JSON is a part of). ZoError, one line, for a missing, unreadable or
    malformed file, or one that is not a mapping of names."""
    path = Path(path)
    need_file(path, what=what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ZoError(f"{what} {path}: not UTF-8 text") from None
    except OSError as exc:
        raise ZoError(f"{what} {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ZoError(f"{what} {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "malformed"
        raise ZoError(f"{what} {path}: not valid YAML ({where}{problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ZoError(f"{what} {path}: must be a mapping of option names to values "
                      f"(e.g. `batch: 16`), got {type(data).__name__}")
    return data


def nearest(key: str, names: list[str]) -> str:
    """' (did you mean X?)' for the nearest of `names`, or '' when none is near."""
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def field_values(data: Mapping[str, Any], names: Mapping[str, str], hints: Mapping[str, Any],
                 *, where: str) -> dict[str, Any]:
    """{field: value} of a file's mapping: each key one of `names` (a spelling of a
    field), each value of its field's type (`hints`). ZoError, one line, for an unknown
    key (with the nearest valid one), a field given twice under two spellings, or a
    value of another type."""
    out: dict[str, Any] = {}
    spelt: dict[str, str] = {}
    for key, value in data.items():
        name = names.get(key)
        if name is None:
            raise ZoError(f"{where}: unknown option {key!r}{nearest(key, list(names))}")
        if name in out:
            raise ZoError(f"{where}: {key!r} and {spelt[name]!r} are the same option: give it once")
        out[name], spelt[name] = typed(value, hints[name], key=key, where=where), key
    return out


def typed(value: Any, hint: Any, *, key: str, where: str) -> Any:
    """`value` (as YAML or JSON give it) as a value of type `hint` (int, float, str,
    bool, Path, tuple[str, ...], a Literal, or one of them | None); ZoError naming
    `key` otherwise. A tuple of strings may be given as a list or comma-separated."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return typed(value, inner[0], key=key, where=where)
    if origin is Literal:
        if value not in args:
            raise _wrong(key, where, value, f"one of {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _wrong(key, where, value, "a list of names (or one comma-separated string)")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise _wrong(key, where, value, "true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong(key, where, value, "a whole number")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise _wrong(key, where, value, "a finite number")
        return float(value)
    if hint in (str, Path):
        if not isinstance(value, str) or not value:
            raise _wrong(key, where, value, "a non-empty string")
        return value if hint is str else Path(value)
    raise TypeError(f"configfile.typed: no rule for {hint!r}")


def _wrong(key: str, where: str, value: Any, must: str) -> ZoError:
    return ZoError(f"{where}: {key} must be {must}, got {value!r}")


def dumps(values: Mapping[str, Any], *, as_json: bool = False) -> str:
    """A config file's text of {option name: value} (tuples as lists, paths as text):
    YAML, or JSON with `as_json`; read back by read_mapping to the same values."""
    plain = {k: list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v
             for k, v in values.items()}
    if as_json:
        return json.dumps(plain, indent=2) + "\n"
    return str(yaml.safe_dump(plain, sort_keys=False, default_flow_style=False))


# ---- zoexec run's keys: any of an option's names (zoexec.flags) ----------------------------
def key_of(name: str) -> str:
    """A name as a file key is matched: no leading dashes, dashes as underscores."""
    return name.lstrip("-").replace("-", "_")


def names_table(options: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """{matched key: the option's field name} from (field name, its other names) pairs:
    the field's name, its flag with or without dashes, an alias (HF Trainer's)."""
    table: dict[str, str] = {}
    for field, others in options:
        for name in (field, *others):
            table[key_of(name)] = field
    return table


def read_config(path: Path | str, names: Mapping[str, str], *,
                what: str = "--config") -> dict[str, Any]:
    """The options of the config file `path`, {field name: value as the file gives it},
    its keys matched by `names` (names_table: dashes and underscores alike). ZoError, one
    line, for a file that is missing, malformed or not a mapping, an unknown key (with
    the nearest valid name) and a key given twice under two names."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ZoError(f"{what} {path}: a config file is .yaml, .yml or .json")
    out: dict[str, Any] = {}
    for key, value in read_mapping(path, what=what).items():
        field = names.get(key_of(key))
        if field is None:
            raise ZoError(f"{what} {path}: unknown option {key!r}"
                          f"{nearest(key_of(key), list(names))}")
        if field in out:
            raise ZoError(f"{what} {path}: {key!r} sets {field!r} a second time (under "
                          f"another of its names)")
        out[field] = value
    return out


def write_config(values: Mapping[str, Any], target: str) -> str | None:
    """Write `values` as a config file: to `target` (YAML, or JSON for .json; written
    whole or not at all), or, for "-", return the YAML text for stdout."""
    if target == "-":
        return dumps(values)
    path = Path(target)
    if path.suffix.lower() not in SUFFIXES:
        raise ZoError(f"--print-config {path}: a config file is .yaml, .yml or .json (or - "
                      f"for stdout)")
    if not path.parent.is_dir():
        raise ZoError(f"--print-config {path}: folder {path.parent} does not exist")
    atomic_write_text(path, dumps(values, as_json=path.suffix.lower() == ".json"))
    return None
