"""The wheels the GPU machine's image must be given for zoplan + zoexec (docs/gpu.md),
chosen by version, not by name: manylinux x86_64 binary wheels for one CPython version,
one version of each, at most 20 MiB in all.

What is carried:
1. each of the project's own pins (pyproject.toml) that `zoplan` and `zoexec run`
   import, unless the image is documented to hold that very version. The image's own
   CUDA-built or compiled-against packages are never carried (IMAGE_OWN: torch,
   transformers, tokenizers, safetensors, numpy); `datasets`, `gguf` and `peft` are
   imported only by commands the check does not run (data files, GGUF, LoRA);
2. then, wheel by wheel, every `Requires-Dist` (its extras left out, its environment
   markers evaluated for that Python on Linux x86_64) that neither another carried wheel
   nor the image satisfies: a version the image holds counts only where it is
   documented and meets the specifier (typing-extensions: the image's version is not
   documented, pydantic needs >= 4.14, so it is carried). A need is fetched at the
   version this checkout's environment has where that satisfies it, else the newest
   that does.

IMAGE below is the image's package list as the device tool documents it (the 'cuda'
image of the nvidia-h200 machine, read on 2026-11-17; versions where a listing gave
them, None where only the name is known).

    python scripts/device_wheels.py [--python-version 3.12] DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
MAX_BYTES = 20 << 20
IMAGE_OWN = {"torch", "transformers", "tokenizers", "safetensors", "numpy"}
NOT_IMPORTED = {"datasets", "gguf", "peft", "accelerate"}
IMAGE: dict[str, str | None] = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "transformers": "5.17.0", "triton": "3.6.0", "torchmetrics": "1.9.0",
    **{name: None for name in (
        "annotated-doc", "anyio", "attrs", "certifi", "click", "filelock", "fsspec", "h11",
        "httpcore", "httpx", "idna", "jinja2", "markdown-it-py", "markupsafe", "mdurl",
        "networkx", "packaging", "peft", "pillow", "psutil", "pygments", "pyyaml", "regex",
        "requests", "rich", "shellingham", "six", "sympy", "tqdm", "typer",
        "typing-extensions", "typing-inspection", "urllib3")},
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_pins() -> list[Requirement]:
    """The project's own pins that the check imports (module docstring, 1.)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in meta["dependencies"] + meta["optional-dependencies"]["exec"]]
    return [r for r in reqs if norm(r.name) not in IMAGE_OWN | NOT_IMPORTED]


def image_satisfies(req: Requirement) -> bool:
    version = IMAGE.get(norm(req.name))
    return version is not None and req.specifier.contains(version, prereleases=True)


def wheel_meta(path: Path) -> tuple[str, Version, list[Requirement]]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    field = lambda key: next(line.split(":", 1)[1].strip() for line in text.splitlines()
                             if line.startswith(f"{key}:"))
    needs = [Requirement(line.split(":", 1)[1]) for line in text.splitlines()
             if line.startswith("Requires-Dist:")]
    return norm(field("Name")), Version(field("Version")), needs


def applies(req: Requirement, python: str) -> bool:
    """A need without an extra whose marker holds for `python` on Linux x86_64."""
    if req.marker is None:
        return True
    env = {"python_version": python, "python_full_version": f"{python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    return req.marker.evaluate(env)


def pick(req: Requirement) -> str:
    """The version to fetch: this environment's where it satisfies `req`, else a range."""
    try:
        here = md.version(req.name)
    except md.PackageNotFoundError:
        here = None
    if here is not None and req.specifier.contains(here, prereleases=True):
        return f"{req.name}=={here}"
    return f"{req.name}{req.specifier}"


def download(spec: str, folder: Path, python: str) -> Path:
    """The wheel of `spec` in `folder` (fetched unless there): the newest that meets it."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "-d", str(folder)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if subprocess.run(cmd + [spec]).returncode:
        sys.exit(f"error: pip could not download {spec} for Python {python}")
    req = Requirement(spec)
    found = [(meta[1], w) for w in folder.glob("*.whl")
             if (meta := wheel_meta(w))[0] == norm(req.name)
             and req.specifier.contains(meta[1], prereleases=True)]
    if not found:
        sys.exit(f"error: pip downloaded no wheel of {spec}")
    return max(found)[1]


def gather(folder: Path, python: str) -> dict[str, Path]:
    """Carry what the module docstring says, wheel by wheel, until every need is met."""
    carried: dict[str, Path] = {}
    todo = [r for r in project_pins() if not image_satisfies(r)]
    while todo:
        req = todo.pop(0)
        name = norm(req.name)
        if name in carried:
            have = wheel_meta(carried[name])[1]
            if not req.specifier.contains(have, prereleases=True):
                sys.exit(f"error: {req} conflicts with the carried {name} {have}")
            continue
        if name in IMAGE_OWN:
            if not image_satisfies(req):
                sys.exit(f"error: a carried wheel needs {req}, which the image's own {name} "
                         f"({IMAGE.get(name)}) may not meet")
            continue
        carried[name] = download(pick(req), folder, python)
        for need in wheel_meta(carried[name])[2]:
            if applies(need, python) and not image_satisfies(need):
                todo.append(need)
    return carried


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    carried = gather(args.dir, args.python_version)
    keep = set(carried.values())
    for wheel in args.dir.glob("*.whl"):       # other versions, other packages: removed
        if wheel not in keep:
            wheel.unlink()
    total = sum(w.stat().st_size for w in keep)
    if total > MAX_BYTES:
        sys.exit(f"error: the wheels in {args.dir} take {total / 2**20:.1f} MiB, more than 20 MiB")
    print(f"{len(keep)} wheels, {total / 2**20:.1f} MiB in {args.dir}: "
          + ", ".join(sorted(w.name for w in keep)))


if __name__ == "__main__":
    main()
