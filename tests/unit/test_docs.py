"""Docs the code keeps true:
- the generated parts (scripts/gen_docs.py) are current: docs/options.md's reference
  from the option fields, the README's Figures from docs/figures.md;
- every path, module and command a document names exists: the repository paths,
  links and document names of README.md and docs/*.md, the zoplan./zoexec. modules
  (and the name after them) of those and of every module's text, and the `zoexec` /
  `zoplan` commands and their options;
- the README's reading order lists every document."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(p for d in ("zoplan", "zoexec", "scripts", "benchmarks")
                 for p in (ROOT / d).rglob("*.py"))
TOP = ("zoplan", "zoexec", "docs", "scripts", "benchmarks", "tests", "examples", "hwprofiles")
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(TOP) + r")/[\w.*-]*(?:/[\w.*-]+)*/?)")
OUTPUT = re.compile(r"(?:-o|--out|--output|--output-dir|>)\s+$")   # a path a command writes
MODULE = re.compile(r"(?<![\w./-])((?:zoplan|zoexec)(?:\.[A-Za-z_]\w*)+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MD_NAME = re.compile(r"(?<![\w/.-])([\w-]+(?:/[\w-]+)*\.md)\b")
COMMAND = re.compile(r"\b(zoexec|zoplan)\s+([a-z][\w-]*)([^`\n|]*)")
# Named before they exist (none now: benchmarks/results/, once here, holds the GPU
# check's logs).
PLANNED: set[str] = set()
# Files of the public repositories docs/sources.md cites, by name (not in this one).
CITED_ELSEWHERE = {("docs/sources.md", "Azure_Results/ND_A100_v4_results.md"),
                   ("docs/sources.md", "Azure_Results/ND_H200_v5_results.md"),
                   ("docs/sources.md", "compute/accelerator/README.md")}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- generated parts ----------------------------------------------------------------------
def test_the_generated_parts_are_current():
    gen = _script("gen_docs")
    found = [gen.problem(path, path.read_text(), want) for path, want in gen.expected().items()]
    assert not any(found), "\n".join(f for f in found if f)


def test_a_stale_generated_part_is_found():
    """The guard can fail: an option's line gone or its help edited by hand, a README
    figure edited there instead of in docs/figures.md."""
    gen = _script("gen_docs")
    want = gen.expected()
    text = want[gen.DOC]
    row = next(line for line in text.splitlines() if line.startswith("| `--save-best"))
    assert "--save-best" in gen.problem(gen.DOC, text.replace(row + "\n", ""), text)
    assert gen.problem(gen.DOC, text.replace("Snapshots kept (the newest)", "Snapshots kept"),
                       text)
    readme = want[gen.README]
    assert gen.problem(gen.README, readme.replace(" s a step, ", "0 s a step, ", 1), readme)
    # a GPU figure of docs/gpu.md edited by hand (scripts/gpu_figures.py makes them)
    gpu = want[gen.GPU_DOC]
    assert gen.problem(gen.GPU_DOC, gpu.replace("| offload | step |", "| offload | step | 1", 1), gpu)
    row = next(line for line in gpu.splitlines() if line.startswith("| OPT-1.3B offloaded step"))
    assert gen.problem(gen.GPU_DOC, gpu.replace(row, row.replace("predicted", "guessed")), gpu)


# ---- what the documents name --------------------------------------------------------------
def _ignored(path: str) -> bool:
    out = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
    return out.returncode == 0


def missing_paths(doc: Path, text: str) -> list[str]:
    """Repository paths `text` names that are not in the tree (outputs a command writes,
    ignored folders and PLANNED aside); globs must match something."""
    bad = []
    for line in text.splitlines():
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".")
            if OUTPUT.search(line[:m.start()]) or path in PLANNED:
                continue
            exists = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
            if not exists and not _ignored(path):
                bad.append(f"{doc.relative_to(ROOT)}: {path}")
    return bad


def missing_links(doc: Path, text: str) -> list[str]:
    """Links to files of the repository that are not there; bare *.md names that are
    no document (CITED_ELSEWHERE aside)."""
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z]+:", target) and not (doc.parent / target).exists():
            bad.append(f"{doc.relative_to(ROOT)}: link {target}")
    name = str(doc.relative_to(ROOT))
    for m in MD_NAME.finditer(LINK.sub("]", text)):
        md = m.group(1)
        if (name, md) in CITED_ELSEWHERE or (ROOT / md).exists() or (ROOT / "docs" / md).exists():
            continue
        if not (doc.parent / md).exists():
            bad.append(f"{name}: document {md}")
    return bad


def _module_file(parts: list[str]) -> Path | None:
    path = ROOT.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_modules(where: Path, text: str) -> list[str]:
    """zoplan./zoexec. names in `text` whose module is not in the tree, or whose next
    name (a function, class or constant) the module does not define or import."""
    bad = []
    for m in MODULE.finditer(text):
        parts = m.group(1).split(".")
        for i in range(len(parts), 0, -1):
            source = _module_file(parts[:i])
            if source is None:
                continue
            if i < len(parts) and not re.search(rf"\b{re.escape(parts[i])}\b", source.read_text()):
                bad.append(f"{where.relative_to(ROOT)}: {m.group(1)} ({parts[i]} is not in "
                           f"{source.relative_to(ROOT)})")
            break
        else:
            bad.append(f"{where.relative_to(ROOT)}: module {m.group(1)}")
    return bad


def _commands() -> dict[str, dict[str, set[str]]]:
    """zoexec's and zoplan's commands, each with its options."""
    import typer.main

    from zoexec.cli import app as zoexec_app
    from zoplan.cli import app as zoplan_app

    out: dict[str, dict[str, set[str]]] = {}
    for tool, app in (("zoexec", zoexec_app), ("zoplan", zoplan_app)):
        group = typer.main.get_command(app)
        out[tool] = {name: {"--help", *(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))}
                     for name, cmd in group.commands.items()}
    return out


def _code(text: str) -> list[str]:
    """The code of a markdown text: each line of its fenced blocks (a line continued
    with \\ joined to the next) and each `inline` span."""
    out, fenced = [], False
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            out.append(line)
        else:
            out += re.findall(r"`([^`]+)`", line)
    return out


def unknown_options(doc: Path, text: str, commands: dict[str, dict[str, set[str]]]) -> list[str]:
    """`zoexec CMD --opt` / `zoplan CMD --opt` naming an option CMD does not have (in
    prose and code; a command line continued with \\ counts as one); a `zoexec` or
    `zoplan` command in code that does not exist."""
    bad = []
    code = _code(text)
    for line in [*text.replace("\\\n", " ").splitlines(), *code]:
        for m in COMMAND.finditer(line):
            tool, name, rest = m.groups()
            if name not in commands[tool]:
                continue
            for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                if option not in commands[tool][name]:
                    bad.append(f"{doc.relative_to(ROOT)}: {tool} {name} {option}")
    for line in code:
        m = re.match(r"\s*(?:\S*/)?(zoexec|zoplan)\s+([a-z][\w-]*)", line)
        if m and m[2] not in commands[m[1]]:
            bad.append(f"{doc.relative_to(ROOT)}: {m[1]} {m[2]}: no such command")
    return sorted(set(bad))


def test_every_path_module_and_command_a_document_names_exists():
    commands = _commands()
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        bad += missing_paths(doc, text) + missing_links(doc, text) + missing_modules(doc, text)
        bad += unknown_options(doc, text, commands)
    for source in SOURCES:
        text = source.read_text()
        bad += missing_modules(source, text) + [b for b in missing_paths(source, text)
                                                if "tests/" in b or "docs/" in b]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("text,finds", [
    ("see `zoexec/engine.py`", "zoexec/engine.py"),
    ("rules in zoplan.gantt", "zoplan.gantt (gantt is not in zoplan/__init__.py)"),
    ("zoexec.data.tasks.TaskSpec holds it", "TaskSpec is not in"),
    ("read [the notes](hardware.md)", "link hardware.md"),
    ("the figures of hardware.md", "document hardware.md"),
    ("```\nzoexec run plan.json --no-such-option 3\n```", "zoexec run --no-such-option"),
    ("```\nzoexec train plan.json\n```", "zoexec train: no such command"),
])
def test_a_stale_name_is_found(text, finds):
    """The guard can fail: each kind of stale name in a document is reported."""
    doc = ROOT / "docs" / "probe.md"
    bad = (missing_paths(doc, text) + missing_links(doc, text) + missing_modules(doc, text)
           + unknown_options(doc, text, _commands()))
    assert any(finds in b for b in bad), bad
    fine = "`zoexec/config.py`, zoexec.config.RunConfig, [code](code.md), `zoexec run plan.json --lr 1e-3`"
    assert missing_paths(doc, fine) + missing_links(doc, fine) + missing_modules(doc, fine) \
        + unknown_options(doc, fine, _commands()) == []


def test_the_readme_s_reading_order_lists_every_document():
    readme = (ROOT / "README.md").read_text()
    index = readme.split("## Documents, in reading order", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\(docs/([\w-]+\.md)\)", index))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_the_readme_is_short_and_starts_with_the_product():
    """At most 250 lines, and the documents' reading order within its first 60: the
    README is the product and where to read next (history: docs/changelog.md; every
    figure: docs/figures.md)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    heading = lines.index("## Documents, in reading order")
    assert heading < 60, heading


def test_the_benchmarks_index_names_every_script():
    """benchmarks/README.md has a row for every script under benchmarks/ (a new one is
    indexed with what it prints and where its figures are kept)."""
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = {p.relative_to(ROOT / "benchmarks").as_posix()
               for p in (ROOT / "benchmarks").glob("*/*.py") if p.parent.name != ".cache"}
    assert scripts, "no benchmark scripts found"
    assert sorted(s for s in scripts if f"`{s}`" not in index) == []
