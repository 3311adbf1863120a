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
import typing
from typing import Annotated, Any, Optional

import typer

from zoexec.config import Section, choices_of, field_named, flag_of, option_fields

PARAM = inspect.Parameter.KEYWORD_ONLY


def shown_default(f) -> str | bool:
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


def _base_type(f, hint) -> type:
    """The command line's type of a field: str for fixed sets (shown as the option's
    metavar, checked by the field: a wrong value is one `error:` line, not a usage
    error) and parsed text, else the field's own type without None."""
    if f.metadata["parse"] is not None or choices_of(f, hint):
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def option_param(f, hint, panel: str) -> inspect.Parameter:
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
    params = []
    for section in sections:
        hints = typing.get_type_hints(section)
        params += [option_param(f, hints[f.name], section.PANEL) for f in option_fields(section)
                   if f.name not in skip and (keep is None or f.name in keep)]
    return params


def with_params(func, params: list[inspect.Parameter]):
    """`func(**values)` with the signature typer reads: `params`."""
    func.__signature__ = inspect.Signature(params)
    func.__annotations__ = {}
    return func


def given(values: dict) -> dict:
    """The options given on the command line, {field: value} (parsed where the field
    parses its text): None and False are "not given"."""
    out = {}
    for name, value in values.items():
        if value is None or value is False:
            continue
        f = field_named(name)
        parse = f.metadata["parse"] if f is not None else None
        out[name] = parse(value) if parse else value
    return out
