#!/usr/bin/env bash
# Run HERE (a machine with network), from anywhere in the repository, before a GPU run:
#   bash bench/gpu/prepare.sh
# Downloads the wheels listed in bench/gpu/wheels.txt for the GPU machine (CPython 3.12,
# manylinux x86_64) into .whl/ (git-ignored), removes any other file there, and prints what
# must travel with the working tree (carry: [".whl"]) and the device call to make.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
list="bench/gpu/wheels.txt"
mkdir -p .whl
requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$list" | grep -v '^$' > "$requirements"

"$python" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    -d .whl -r "$requirements"

# Keep exactly one wheel per listed name==version (an older download would install twice).
"$python" - "$requirements" <<'PY'
import re
import sys
from pathlib import Path

def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()

wanted = {}
for line in Path(sys.argv[1]).read_text().split():
    name, version = line.split("==")
    wanted[norm(name)] = version
found = {}
for wheel in sorted(Path(".whl").iterdir()):
    parts = wheel.name.split("-")
    ok = wheel.suffix == ".whl" and wanted.get(norm(parts[0])) == parts[1]
    if not ok:
        print(f"removing {wheel.name} (not in bench/gpu/wheels.txt)")
        wheel.unlink()
    else:
        found[norm(parts[0])] = wheel.name
missing = sorted(set(wanted) - set(found))
if missing:
    sys.exit(f"missing wheels: {', '.join(missing)}")
PY

count="$(find .whl -name '*.whl' | wc -l)"
size="$(du -sh .whl | cut -f1)"
cat <<MSG
.whl/: $count wheels, $size (the device run carries at most 64 MiB with the working tree).
Carry: [".whl"]   (ignored by git, so it travels only when named in carry)
Device call (one command, timeout_s 480; see bench/gpu/README.md):
  command: bash bench/gpu/run.sh --out "\$OUT"
  carry:   [".whl"]
MSG
