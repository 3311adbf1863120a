"""The command line made from the config's fields: each option field of a
zoexec.config section becomes one typer option (its names, help, panel, choices and
the default --help shows), and the values given come back as {field: value}.

Every generated option's default is None (a bool flag's: False), so that the builder
(zoexec.options) knows what was given: a resume refuses a given setting that differs
from its run's, and a field with an environment default reads the variable only when
the option is not given. The defaults themselves live in the fields alone.
"""

from __future__ import annotations

import inspect
import shlex
import typing
from collections.abc import Callable, Collection
from dataclasses import Field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from zoexec.config import SECTIONS, field_named
from zoexec.fields import Section, choices_of, flag_of, option_fields
from zoplan.configfile import key_of, names_table, read_config

PARAM = inspect.Parameter.KEYWORD_ONLY


def shown_default(f: Field[Any]) -> str | bool:
    """The default --help shows: the field's (its environment variable first)."""
    meta = f.metadata
    text = meta["shown"] if meta["shown"] is not None else _plain(f.default)
    if meta["env"]:
        return f"${meta['env']} or {text}" if text else f"${meta['env']}"
    return text if text else False


def _plain(value: Any) -> str:
    if value is None or value is False or value == ():
        return ""
    return str(value)


def _base_type(f: Field[Any], hint: Any) -> Any:
    """The command line's type of a field: str for fixed sets (shown as the option's
    metavar, checked by the field: a wrong value is one `error:` line, not a usage
    error) and parsed text, else the field's own type without None."""
    if f.metadata["parse"] is not None or choices_of(f, hint):
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint   # a type (int, float, str, bool, Path)


def option_param(f: Field[Any], hint: Any, panel: str) -> inspect.Parameter:
    """The typer parameter of one option field."""
    meta = f.metadata
    choices = choices_of(f, hint)
    kind = _base_type(f, hint)
    names = (flag_of(f), *meta["aliases"])
    metavar = meta["metavar"] or ("[" + "|".join(choices) + "]" if choices else None)
    opt = typer.Option(*names, help=meta["help"], rich_help_panel=panel,
                       show_default=shown_default(f), metavar=metavar)
    if kind is bool:
        return inspect.Parameter(f.name, PARAM, default=False, annotation=Annotated[bool, opt])
    return inspect.Parameter(f.name, PARAM, default=None,
                             annotation=Annotated[Optional[kind], opt])


def section_params(*sections: type[Section], skip: tuple[str, ...] = (),
                   keep: tuple[str, ...] | None = None) -> list[inspect.Parameter]:
    """The typer parameters of the sections' option fields (those in `keep`, but `skip`)."""
    params: list[inspect.Parameter] = []
    for section in sections:
        hints = typing.get_type_hints(section)
        params += [option_param(f, hints[f.name], section.PANEL) for f in option_fields(section)
                   if f.name not in skip and (keep is None or f.name in keep)]
    return params


def with_params(func: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    """`func(**values)` with the signature typer reads: `params` (inspect.signature
    reads a function's __signature__ attribute)."""
    vars(func)["__signature__"] = inspect.Signature(params)
    func.__annotations__ = {}
    return func


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line, {field: value} (parsed where the field
    parses its text): None and False are "not given"."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value is False:
            continue
        f = field_named(name)
        parse = f.metadata["parse"] if f is not None else None
        out[name] = parse(value) if parse else value
    return out


# ---- the resume command a run prints -----------------------------------------------------------
# the options a resume takes from the plan or run.json, or that only a new run reads: the
# resume command never repeats them (repeated)
NOT_REPEATED = ("out", "resume", "overwrite", "steps", "new_schedule", "accept_moved_inputs",
                "model_path", "init", "save_steps")


def repeated(given: dict[str, Any]) -> tuple[str, ...]:
    """The command-line words of the options given that a resume needs again: those
    run.json does not keep (the runtime's, --quiet, --trace); the plan's sections' are
    the plan's."""
    words: list[str] = []
    for name in ("model", "task", "optim", "checkpoint", "logging", "runtime"):
        for f in option_fields(SECTIONS[name]):
            value = given.get(f.name)
            if f.metadata["kept"] is not None or f.name in NOT_REPEATED or value in (None, False):
                continue
            words.append(flag_of(f))
            if value is not True:
                words.append(",".join(value) if isinstance(value, tuple) else str(value))
    return tuple(words)


def resume_command(plan_path: Path | str, folder: Path | str, repeat: tuple[str, ...]) -> str:
    """The whole command that resumes the run in `folder` (run.json keeps the rest)."""
    return shlex.join(["zoexec", "run", str(plan_path), "--resume", str(folder), *repeat])


# ---- options from a config file (zoplan.configfile) ------------------------------------------
def names_of(*sections: type[Section], only: Collection[str] | None = None) -> dict[str, str]:
    """{a config file's key: field name} of the sections' options (those in `only`: a
    command's own): each under its field name, its flag and its aliases (HF Trainer's
    included)."""
    return names_table((f.name, (flag_of(f), *f.metadata["aliases"], *f.metadata["hidden_aliases"]))
                       for section in sections for f in option_fields(section)
                       if only is None or f.name in only)


def config_options(path: Path | str, *sections: type[Section],
                   only: Collection[str] | None = None) -> dict[str, Any]:
    """The options of a config file as `given` returns the command line's, {field:
    value}: each value of its option's type, as the option's text on the command line
    would give it (zoplan.configfile.read_config: the one key matcher and value typer
    `zoplan optimize` uses too); `only`: the fields the command takes (all the
    sections' when None). ZoError (one line) naming an unknown key and the nearest
    valid one, or a key whose value is not of its option's type."""
    fields = [(f, hint) for section in sections for f, hint in _hinted(section)
              if only is None or f.name in only]
    values = read_config(path, names_of(*sections, only=only),
                         {f.name: hint for f, hint in fields},
                         parsers={f.name: f.metadata["parse"] for f, _ in fields})
    return {k: v for k, v in values.items() if v is not None and v is not False}


def _hinted(section: type[Section]) -> list[tuple[Field[Any], Any]]:
    hints = typing.get_type_hints(section)
    return [(f, hints[f.name]) for f in option_fields(section)]


def config_values(options: dict[str, Any]) -> dict[str, Any]:
    """`options` ({field: value}, as given) as a config file holds them: under the
    option's flag (`task`, `lr`, `eval_every`), in plain values (a list for a
    comma-separated option): what config_options reads back to the same options."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, tuple):
            value = list(value)
        elif not isinstance(value, bool | int | float | str):
            value = str(value)
        f = field_named(name)
        out[key_of(flag_of(f)) if f is not None else name] = value
    return out
