#!/usr/bin/env bash
# The GPU kit (bench/gpu/README.md), run from the repository root or anywhere in it:
#   bash bench/gpu/run.sh --out "$OUT"     # on the GPU machine: every step, <= 455 s
#   bash bench/gpu/run.sh --cpu-dry-run    # the same steps on the CPU at smoke size (make test)
# Options: --out DIR (default $OUT, else build/gpu-kit), --work DIR, --budget SECONDS,
#          --only STEP... (tests transfers startup served density).
# The GPU run installs .whl/*.whl (bench/gpu/prepare.sh) into a private target and runs the
# six distributions from packages/*/src: nothing is pip-installed into the machine's Python.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
mode=gpu
out="${OUT:-$root/build/gpu-kit}"
work=""
budget=""
only=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpu-dry-run) mode=cpu-dry-run ;;
        --out) out="$2"; shift ;;
        --work) work="$2"; shift ;;
        --budget) budget="$2"; shift ;;
        --only)
            shift
            while [[ $# -gt 0 && "$1" != --* ]]; do only+=("$1"); shift; done
            continue ;;
        -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
python="${PYTHON:-python3}"
site="$(mktemp -d "${TMPDIR:-/tmp}/rs-gpu-kit-site.XXXXXX")"
cleanup=("$site")
trap 'rm -rf "${cleanup[@]}"' EXIT

if [[ "$mode" == gpu ]]; then
    budget="${budget:-455}"
    # Kept while the machine stays warm: a rerun reuses the exported bundles and the catalog.
    work="${work:-${TMPDIR:-/tmp}/reactantserver-gpu-kit}"
    if compgen -G ".whl/*.whl" > /dev/null; then
        started=$SECONDS
        "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$site" .whl/*.whl
        echo "run.sh: installed $(ls .whl/*.whl | wc -l) wheels in $((SECONDS - started)) s"
    else
        echo "run.sh: no .whl/*.whl: run bench/gpu/prepare.sh first and carry .whl" >&2
    fi
else
    budget="${budget:-250}"
    if [[ -z "$work" ]]; then
        work="$(mktemp -d "${TMPDIR:-/tmp}/rs-gpu-kit-work.XXXXXX")"
        cleanup+=("$work")
    fi
    export JAX_PLATFORMS=cpu
fi

# The six distributions run from their sources; their __version__ reads package metadata.
for pyproject in packages/*/pyproject.toml; do
    name="$(sed -n 's/^name = "\(.*\)"$/\1/p' "$pyproject" | head -n 1)"
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$pyproject" | head -n 1)"
    meta="$site/${name//-/_}-$version.dist-info"
    mkdir -p "$meta"
    printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" > "$meta/METADATA"
done
sources="$(printf '%s:' "$root"/packages/*/src)"
export PYTHONPATH="$site:$sources$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

mkdir -p "$out"
status=0
"$python" -m bench.gpu.kit --mode "$mode" --out "$out" --work "$work" --budget "$budget" \
    ${only[@]+--only "${only[@]}"} || status=$?
exit "$status"
