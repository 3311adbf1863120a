#!/usr/bin/env bash
# The wheels the GPU machine's image lacks for zoplan + zoexec (docs/gpu.md): pydantic and
# simpy at the versions pyproject.toml pins, and their needs that the image does not
# have (pydantic-core, annotated-types, typing-inspection); manylinux x86_64 binary
# wheels for one CPython version, one version of each. `datasets` is left out: only
# data files (--data) need it, its import is lazy, and the GPU check trains on
# synthetic data. Each wheel's Requires-Dist is checked against the image's packages
# and the folder: a need found in neither stops the script. At most 20 MiB in all.
#   bash scripts/device_wheels.sh [--python-version 3.12] DIR
# Idempotent: wheels already in DIR are kept, other versions of the same packages removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=3.12
while [ $# -gt 1 ]; do
  case "$1" in
    --python-version) PY_VERSION=$2; shift 2 ;;
    *) echo "error: unknown option $1 (usage: device_wheels.sh [--python-version 3.12] DIR)" >&2; exit 2 ;;
  esac
done
if [ $# -ne 1 ]; then
  echo "error: usage: device_wheels.sh [--python-version 3.12] DIR" >&2; exit 2
fi
DIR=$1
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p "$DIR"
# the image's packages that these wheels may need (/work/.library/device/KINDS.md lists all)
IMAGE_HAS="typing-extensions numpy rich typer networkx safetensors tokenizers psutil torch transformers"
# pydantic and simpy as pyproject.toml pins them; their needs at the versions pydantic's
# own metadata accepts (pydantic-core: its exact pin), as this checkout's .venv has them
PINS=$("$PY" - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if re.match(r"(pydantic|simpy)==", d)))
EOF
)
NEEDS="pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5"
PLATFORMS=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS="$PLATFORMS --platform $p"
done
for req in $PINS $NEEDS; do
  name=${req%%==*}; stem=$(echo "$name" | tr - _)
  for old in "$DIR"/"$stem"-*.whl; do   # another version of it: removed (one of each)
    [ -e "$old" ] || continue
    case "$(basename "$old")" in "$stem-${req##*==}-"*) ;; *) rm -f "$old" ;; esac
  done
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp $PLATFORMS -d "$DIR" "$req" \
    || { echo "error: pip could not download $req for Python $PY_VERSION" >&2; exit 2; }
done
"$PY" - "$DIR" "$IMAGE_HAS" <<'EOF'
import re, sys, zipfile
from pathlib import Path

folder, image = Path(sys.argv[1]), set(sys.argv[2].split())
wheels = sorted(folder.glob("*.whl"))
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(w.name.split("-")[0]) for w in wheels}
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                need = norm(re.split(r"[ ;<>=!~\[(]", line.split(":", 1)[1].strip())[0])
                if need not in have and need not in image:
                    sys.exit(f"error: {wheel.name} needs {need}, which neither the image nor {folder} has")
total = sum(w.stat().st_size for w in wheels)
if total > 20 * 2**20:
    sys.exit(f"error: the wheels in {folder} take {total / 2**20:.1f} MiB, more than 20 MiB")
print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {folder}: " + ", ".join(w.name for w in wheels))
EOF
