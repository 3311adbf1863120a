"""Options from a file (`zoexec run --config run.yaml`; `zoplan optimize` may use it
alike): a YAML or JSON mapping of option names to values, its keys matched to the
command's options, and the file written back (`--print-config`).

A key is an option under any of its names: the field's (`learning_rate`), its flag
with or without the dashes (`--lr`, `lr`), an alias (HF Trainer's `max_steps`,
`learning-rate`); dashes and underscores are the same. An unknown key is one ZoError
naming the key and the nearest valid name (difflib). The values are the file's as they
are (a command turns them into its options' types). Torch-free; YAML needs PyYAML
(pinned with the executor's extra), JSON does not.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from zoplan.errors import ZoError
from zoplan.io import atomic_write_text, need_file

try:   # PyYAML: the executor's extra pins it; the planner alone reads JSON configs
    import yaml as _YAML
except ModuleNotFoundError:
    _YAML = None

YAML_SUFFIXES = (".yaml", ".yml")
SUFFIXES = (*YAML_SUFFIXES, ".json")


def key_of(name: str) -> str:
    """A name as a file key is matched: no leading dashes, dashes as underscores."""
    return name.lstrip("-").replace("-", "_")


def names_table(options: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """{matched key: the option's field name} from (field name, its other names) pairs."""
    table: dict[str, str] = {}
    for field, others in options:
        for name in (field, *others):
            table[key_of(name)] = field
    return table


def _yaml() -> Any:
    if _YAML is None:
        raise ZoError("a YAML config needs the pyyaml package (pip install \"zoplan[exec]\"), "
                      "or write it as JSON (.json)")
    return _YAML


def read_config(path: Path | str, names: Mapping[str, str], *,
                what: str = "--config") -> dict[str, Any]:
    """The options of the config file `path`, {field name: value}, its keys matched by
    `names` (names_table). ZoError, one line, for a file that is missing or not a
    mapping of names, for an unknown key and for a key given twice under two names."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ZoError(f"{what} {path}: a config file is .yaml, .yml or .json")
    text = need_file(path, what=what).read_text()
    try:
        if path.suffix.lower() in YAML_SUFFIXES:
            yaml = _yaml()
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise ZoError(f"{what} {path}: not valid YAML{where}") from None
        else:
            data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ZoError(f"{what} {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZoError(f"{what} {path}: holds a {type(data).__name__}, not a mapping of "
                      f"option names to values")
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = names.get(key_of(str(key)))
        if field is None:
            raise ZoError(f"{what} {path}: unknown option {key!r}{_nearest(str(key), names)}")
        if field in out:
            raise ZoError(f"{what} {path}: {key!r} sets {field!r} a second time (under "
                          f"another of its names)")
        out[field] = value
    return out


def _nearest(key: str, names: Mapping[str, str]) -> str:
    close = difflib.get_close_matches(key_of(key), list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def config_text(values: Mapping[str, Any], *, json_format: bool) -> str:
    """`values` ({field name: plain value}) as a config file's text, YAML or JSON."""
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    if json_format:
        return json.dumps(plain, indent=1) + "\n"
    return str(_yaml().safe_dump(plain, sort_keys=False, default_flow_style=False))


def write_config(values: Mapping[str, Any], target: str) -> str | None:
    """Write `values` as a config file: to `target` (YAML, or JSON for .json; written
    whole or not at all), or, for "-", return the YAML text for stdout."""
    if target == "-":
        return config_text(values, json_format=False)
    path = Path(target)
    if path.suffix.lower() not in SUFFIXES:
        raise ZoError(f"--print-config {path}: a config file is .yaml, .yml or .json (or - "
                      f"for stdout)")
    if not path.parent.is_dir():
        raise ZoError(f"--print-config {path}: folder {path.parent} does not exist")
    atomic_write_text(path, config_text(values, json_format=path.suffix.lower() == ".json"))
    return None
