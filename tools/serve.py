"""``make serve``: export the demo bundles, then run the node on them (CPU, :8001/:8002).

Each ``examples/<name>/export.py`` is run as ``python -m examples.<name>.export --out DIR``
(weights from a fixed seed, no downloads); then ``reactantserver-node`` supervises a CPU
worker over DIR. Any step that fails stops here with its exit status and a clear message.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NODE_FILE = """\
# Written by `make serve`: one CPU worker behind the public ports.
model_repo: {models}
workers:
  - name: cpu0
"""


def main(argv: list[str] | None = None) -> int:
    """Export the examples and start the node; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument("--models", type=Path, default=ROOT / "build" / "models")
    args = parser.parse_args(argv)
    python = str(args.venv / "bin" / "python")
    models = args.models.resolve()
    models.mkdir(parents=True, exist_ok=True)

    examples = sorted(p.parent.name for p in (ROOT / "examples").glob("*/export.py"))
    if not examples:
        print("make serve: no examples/<name>/export.py yet (export lands with issue #4).")
    for name in examples:
        print(f"make serve: exporting examples/{name} into {models}")
        done = subprocess.run(
            [python, "-m", f"examples.{name}.export", "--out", str(models)], cwd=ROOT, check=False
        )
        if done.returncode != 0:
            print(f"make serve: exporting examples/{name} failed ({done.returncode}).")
            return done.returncode

    node_file = models.parent / "node.yaml"
    node_file.write_text(NODE_FILE.format(models=models))
    node = str(args.venv / "bin" / "reactantserver-node")
    print(f"make serve: starting reactantserver-node --node-file {node_file}")
    done = subprocess.run([node, "--node-file", str(node_file)], cwd=ROOT, check=False)
    if done.returncode != 0:
        print(
            "make serve: reactantserver-node stopped with status "
            f"{done.returncode}; the install and export steps above are done."
        )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
