"""Options from a file: `--config FILE` (YAML or JSON, one mapping of option names to
values) read into {field: value}, and `--print-config` writing one back; `zoplan
optimize` and `zoexec run`, `eval` and `lengths` read it through read_config: one key
matcher (match_keys) and one value typer (typed) for every command.

Torch-free and independent of any command: a command gives the names it accepts
(`names`: each spelling -> its field, e.g. {"lora-r": "lora_r", "lr": "lr"}; dashes and
underscores alike) and each field's type; a key of the file outside them is refused in
one line naming the nearest valid one (difflib), a value of the wrong type in one line
naming its key. The command line overrides the file (the caller merges: file first,
then what was given). A contract: zoexec may import it (tests/unit/test_import_rules.py).

    names = {"batch": "batch", "lora-r": "lora_r", ...}
    values = read_config("plan.yaml", names, {"batch": int, "lora_r": int, ...})
"""

from __future__ import annotations

import difflib
import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
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


def key_of(name: str) -> str:
    """A name as a file key is matched: no leading dashes, dashes as underscores
    (`--lora-r`, `lora-r` and `lora_r` are one key)."""
    return name.lstrip("-").replace("-", "_")


def match_keys(data: Mapping[str, Any], names: Mapping[str, str], *,
               where: str) -> dict[str, tuple[str, Any]]:
    """{field: (the key as the file writes it, its value)} of a file's mapping, each key
    matched by `names` (any spelling of a field -> the field; dashes and underscores
    alike: key_of). ZoError, one line, for an unknown key (with the nearest valid one)
    and a field given twice under two of its names. Both commands' one key matcher."""
    table = {key_of(name): field for name, field in names.items()}
    out: dict[str, tuple[str, Any]] = {}
    for key, value in data.items():
        field = table.get(key_of(key))
        if field is None:
            raise ZoError(f"{where}: unknown option {key!r}{nearest(key_of(key), list(table))}")
        if field in out:
            raise ZoError(f"{where}: {key!r} and {out[field][0]!r} are the same option: give "
                          f"it once")
        out[field] = (key, value)
    return out


def typed(value: Any, hint: Any, *, key: str, where: str,
          parse: Callable[[str], Any] | None = None) -> Any:
    """`value` (as YAML or JSON give it) as the option of type `hint` takes it: what the
    command line's text would give (int, float, str, bool, Path, tuple[str, ...], a
    Literal, or one of them | None; a number written as text, `1e-3`, which YAML reads
    as a string, is that number). `parse`: the option's parser of its text (a tuple of
    names, comma-separated), which a list of texts skips. ZoError, one line naming
    `key`, otherwise. Both commands' one value typer."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return typed(value, inner[0], key=key, where=where, parse=parse)
    if origin is Literal:
        if value not in args:
            raise _wrong(key, where, value, f"one of {', '.join(map(str, args))}")
        return value
    if origin is tuple or parse is not None:
        return _names(value, key=key, where=where, parse=parse)
    if hint is bool:
        if not isinstance(value, bool):
            raise _wrong(key, where, value, "true or false")
        return value
    if hint is int:
        number = _number(value)
        if number is None or isinstance(number, float) and not number.is_integer():
            raise _wrong(key, where, value, "a whole number")
        return int(number)
    if hint is float:
        number = _number(value)
        if number is None or not _finite(number):
            raise _wrong(key, where, value, "a finite number")
        return float(number)
    if hint in (str, Path):
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)   # `save_every: 100`: the text 100
        if not isinstance(value, str) or not value:
            raise _wrong(key, where, value, "a non-empty string")
        return value if hint is str else Path(value)
    raise TypeError(f"configfile.typed: no rule for {hint!r}")


def _number(value: Any) -> int | float | None:
    """A number, or a text that is one (`1e-3`, `16`); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return None
    return value


def _finite(number: int | float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:   # an integer past float's range
        return False


def _names(value: Any, *, key: str, where: str,
           parse: Callable[[str], Any] | None) -> Any:
    """A tuple of names: a list of texts, or one text (comma-separated, or what `parse`
    makes of it)."""
    if isinstance(value, str) and parse is not None:
        return parse(value)
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _wrong(key, where, value, "a list of names (or one comma-separated string)")
    return tuple(value)


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


# ---- a command's options: any of an option's names -----------------------------------------
def names_table(options: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """{matched key: the option's field name} from (field name, its other names) pairs:
    the field's name, its flag with or without dashes, an alias (HF Trainer's)."""
    table: dict[str, str] = {}
    for field, others in options:
        for name in (field, *others):
            table[key_of(name)] = field
    return table


def read_config(path: Path | str, names: Mapping[str, str],
                hints: Mapping[str, Any] | None = None, *, what: str = "--config",
                parsers: Mapping[str, Callable[[str], Any] | None] | None = None) -> dict[str, Any]:
    """The options of the config file `path`, {field name: value}: its keys matched by
    `names` (match_keys), each value typed by its field's `hints` (typed; `parsers`: a
    field's parser of its text) or, without `hints`, as the file gives it. ZoError, one
    line, for a file that is missing, malformed, not a mapping or not .yaml/.yml/.json,
    an unknown key (with the nearest valid name), a key given twice under two names and
    a value of another type. `zoplan optimize` and `zoexec run`, `eval` and `lengths`
    read their files through it."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ZoError(f"{what} {path}: a config file is .yaml, .yml or .json")
    where = f"{what} {path}"
    matched = match_keys(read_mapping(path, what=what), names, where=where)
    if hints is None:
        return {field: value for field, (_, value) in matched.items()}
    return {field: typed(value, hints[field], key=key, where=where,
                         parse=(parsers or {}).get(field))
            for field, (key, value) in matched.items()}


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
