"""The parts of the docs made from a single home, so that nothing is written twice:

- docs/options.md's reference part, from the option fields: every option of every
  section (zoexec.config.SECTIONS, EvalOptions) with its names, default, help, the
  commands that take it and what a resume does with it, and what each task type reads
  (zoexec.data.tasktypes); then every option of `zoplan optimize`, section by section
  (zoplan.request.SECTIONS); the part above MARKER is prose, kept as it is;
- the README's Figures section, a copy of docs/figures.md's "At a glance" section
  (links made relative to the repository's root);
- the GPU figures of docs/gpu.md and docs/figures.md (scripts/gpu_figures.py): table
  rows and docs/gpu.md's re-prediction of the GPU pass, made from the pass's results and
  the planner on the shipped profiles, never copied by hand;
- docs/settings.md, the settings that worked on a real model per tuning mode and
  estimator, from benchmarks/results/settings.json (each with its command).

    .venv/bin/python scripts/gen_docs.py           rewrite both
    .venv/bin/python scripts/gen_docs.py --check   exit 1 (naming the first difference)
                                                   when either is not current

tests/unit/test_docs.py runs the check. Torch-free."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "options.md"
README = ROOT / "README.md"
FIGURES = ROOT / "docs" / "figures.md"
GPU_DOC = ROOT / "docs" / "gpu.md"
MARKER = "<!-- generated below by scripts/gen_docs.py from the option fields: do not edit -->"
GLANCE = "## At a glance"
README_START = "<!-- the Figures below are docs/figures.md's \"At a glance\", copied by scripts/gen_docs.py: edit them there -->"
README_END = "## Limits"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
SETTINGS_RESULTS = ROOT / "benchmarks" / "results" / "settings.json"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _commands() -> dict[str, list[tuple[str, str]]]:
    """Option field name -> [(zoexec command, the help it shows there)]."""
    import typer.main

    from zoexec.cli import app

    out: dict[str, list[tuple[str, str]]] = {}
    for name, command in typer.main.get_command(app).commands.items():   # type: ignore[attr-defined]
        for param in command.params:
            out.setdefault(param.name, []).append((name, getattr(param, "help", "") or ""))
    return out


def _names(f: Any) -> str:
    from zoexec.config import flag_of

    metavar = f" {f.metadata['metavar']}" if f.metadata["metavar"] else ""
    names = f"`{flag_of(f)}{metavar}`"
    aliases = ", ".join(f"`{a}`" for a in f.metadata["aliases"])
    return f"{names} ({aliases})" if aliases else names


def _default(f: Any, hint: Any) -> str:
    from zoexec.config import choices_of
    from zoexec.flags import shown_default

    shown = shown_default(f)
    text = f"`{shown}`" if shown else ""
    choices = choices_of(f, hint)
    if choices:
        text += (" of " if text else "one of ") + ", ".join(f"`{c}`" for c in choices)
    return text


def section_table(section: type, commands: dict[str, list[tuple[str, str]]]) -> list[str]:
    from zoexec.config import option_fields

    hints = typing.get_type_hints(section)
    lines = ["| option | default | what it does | commands | a resume |",
             "|--------|---------|--------------|----------|----------|"]
    for f in option_fields(section):
        used = [cmd for cmd, help in commands.get(f.name, []) if help == f.metadata["help"]]
        kept = f.metadata["kept"] or ""
        lines.append(f"| {_cell(_names(f))} | {_cell(_default(f, hints[f.name]))} | "
                     f"{_cell(f.metadata['help'])} | {', '.join(used)} | {kept} |")
    return lines


def task_types_table() -> list[str]:
    from zoexec.data.section import TaskOptions, read_by
    from zoexec.data.tasktypes import TASK_TYPES
    from zoexec.fields import flag_of, option_fields

    flags = {f.name: flag_of(f) for f in option_fields(TaskOptions)}
    lines = ["| `--task` | the options it reads (run.json records them) | and when set | "
             "its evaluation reports |",
             "|----------|----------------------------------------------|--------------|"
             "------------------------|"]
    for t in TASK_TYPES.values():
        own = ", ".join(f"`{flags[n]}`" for n in read_by(t))
        extras = ", ".join(f"`{flags[n]}`" for n in t.extras)
        lines.append(f"| `{t.name}` | {own} | {extras} | {', '.join(t.metrics)} |")
    return lines


def planner_tables() -> list[str]:
    """`zoplan optimize`'s options, a table per section of its request."""
    from zoplan.request import SECTIONS, cli_names, key_of, option_fields, shown_default

    lines = ["## `zoplan optimize`", "",
             "Made from the request's fields (`zoplan/request.py`) by `scripts/gen_docs.py`. "
             "*in --config*: the option's name in a `--config FILE` (YAML or JSON; its other "
             "long names and the field's name with `_` are taken too); the command line "
             "overrides the file, and `--print-config` writes one.", ""]
    for section in SECTIONS.values():
        lines += [f"### {section.PANEL}", "",
                  "| option | default | what it does | in --config |",
                  "|--------|---------|--------------|-------------|"]
        for f in option_fields(section):
            metavar = f" {f.metadata['metavar']}" if f.metadata["metavar"] else ""
            names = ", ".join(f"`{n}{metavar}`" for n in cli_names(f))
            default = f"`{shown_default(f)}`" if shown_default(f) else ""
            choices = f.metadata["choices"]
            if choices:
                default += (" of " if default else "one of ") + ", ".join(f"`{c}`" for c in choices)
            if f.metadata["required"]:
                default = "required"
            lines.append(f"| {_cell(names)} | {_cell(default)} | "
                         f"{_cell(f.metadata['help'])} | `{key_of(f)}` |")
        lines.append("")
    return lines


def generated() -> str:
    """The reference part of docs/options.md (after MARKER)."""
    from zoexec.config import SECTIONS, EvalOptions
    from zoexec.fields import KEPT_WORDS

    commands = _commands()
    lines = [MARKER, "", "## Every option", "",
             "Made from the fields by `scripts/gen_docs.py`. *a resume*: what "
             "`zoexec run --resume` does with the option: "
             + "; ".join(f"**{k}**: {v}" for k, v in KEPT_WORDS.items())
             + "; empty: nothing, the value given (or the default) applies.", ""]
    for key, section in (*SECTIONS.items(), ("eval", EvalOptions)):
        where = f"`cfg.{key}`" if key != "eval" else "`zoexec eval` only"
        lines += [f"### {section.PANEL} ({where})", "", *section_table(section, commands), ""]
    lines += ["## What each task type reads", "",
              "From the registry (`zoexec/data/tasktypes/`); an option set for a task type "
              "that does not read it is refused. `--data`, `--task-preset`, `--eval-data` "
              "and `--eval-samples` go with every type.", "", *task_types_table(), "",
              *planner_tables()]
    return "\n".join(lines).rstrip("\n") + "\n"


def current(text: str) -> str:
    """`text` (docs/options.md) with its generated part made anew."""
    prose = text.split(MARKER)[0].rstrip("\n")
    return prose + "\n\n" + generated()


def readme_figures(readme: str, figures: str) -> str:
    """`readme` with its Figures section (from README_START to README_END) made from
    docs/figures.md's "At a glance" section."""
    glance = figures.split(GLANCE, 1)[1].split("\n## ", 1)[0].strip("\n")
    glance = re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](docs/\1)", glance)
    glance = re.sub(r"\[([\w.-]+\.md)\]\(docs/", r"[docs/\1](docs/", glance)
    head, rest = readme.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    return f"{head}{README_START}\n## Figures\n\n{glance}\n\n{README_END}{tail}"


def _gpu_figures():
    """scripts/gpu_figures.py, loaded once a process (its figures are computed once)."""
    import importlib.util

    module = sys.modules.get("gpu_figures")
    if module is None:
        spec = importlib.util.spec_from_file_location("gpu_figures", ROOT / "scripts" / "gpu_figures.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["gpu_figures"] = module
    return module


def settings_page(results: dict[str, Any]) -> str:
    """docs/settings.md from benchmarks/results/settings.json: one row per measured
    setting, by tuning mode and estimator, then each one's command."""
    entries = results["entries"]
    lines = ["# Settings that worked", "",
             "<!-- made by scripts/gen_docs.py from benchmarks/results/settings.json: edit "
             "that file, then run the script -->", "",
             f"Measured on {results['model']}. Each row is a run's settings and what it gave "
             "on held-out sentences; its command and the section with the whole table are "
             "below. zoexec's defaults are MeZO's for OPT-13B (lr 1e-6, eps 1e-3): a small "
             "model moves at larger rates. These are one model and one task: a starting "
             "point for a sweep (`bench_accuracy.py --parts sweep`), not a rule.", "",
             "| # | tuning | estimator | settings | steps x seeds | prompt | outcome | "
             "not these |",
             "|---|---|---|---|---|---|---|---|"]
    for i, e in enumerate(entries, 1):
        shown = ", ".join(f"{k} {v}" for k, v in e["settings"].items())
        lines.append(f"| {i} | {e['tuning']} | {e['estimator']} | {_cell(shown)} | "
                     f"{e['steps']} x {e['seeds']} | {_cell(e['prompt'])} | "
                     f"{_cell(e['outcome'])} | {_cell(e.get('not', ''))} |")
    lines += ["", "## The commands", ""]
    for i, e in enumerate(entries, 1):
        source = e["source"].removeprefix("docs/")
        command = e["command"] if isinstance(e["command"], list) else [e["command"]]
        lines += [f"{i}. {e['tuning']}, {e['estimator']} ([{source.split('#')[0]}]({source})):",
                  "", "   ```", *(f"   {line}" for line in command), "   ```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def expected() -> dict[Path, str]:
    """Each generated file as it should read now."""
    import json

    gpu = _gpu_figures()
    figures = gpu.apply("figures.md", FIGURES.read_text())
    return {DOC: current(DOC.read_text()), FIGURES: figures,
            GPU_DOC: gpu.apply("gpu.md", GPU_DOC.read_text()),
            README: readme_figures(README.read_text(), figures),
            SETTINGS_DOC: settings_page(json.loads(SETTINGS_RESULTS.read_text()))}


def problem(path: Path, text: str, want: str) -> str | None:
    """What makes `text` (the file `path`) differ from `want`, or None."""
    if text == want:
        return None
    name = str(path.relative_to(ROOT))
    diff = difflib.unified_diff(text.splitlines(), want.splitlines(), name, "generated",
                                lineterm="", n=0)
    return "\n".join([*list(diff)[:12], f"{name} is not current: run "
                      f".venv/bin/python scripts/gen_docs.py"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated part "
                        "is not current")
    args = parser.parse_args(argv)
    found = []
    for path, want in expected().items():
        if not args.check:
            path.write_text(want)
        elif problem(path, path.read_text(), want):
            found.append(problem(path, path.read_text(), want))
    for text in found:
        print(text, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
