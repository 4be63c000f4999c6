"""Command-line entry point of ``reactantserver-export``: a thin argparse
wrapper over the Python API.

    reactantserver-export jax mypkg.model:forward --params mypkg.model:init_params \\
        --input x=f32[n,16] --output logits --batch-sizes 1,8,32 --out models/mlp
    reactantserver-export validate models/mlp --reference mypkg.model:forward \\
        --params mypkg.model:init_params

Exit status: 0 on success, 1 when ``validate`` finds a failure, 2 for bad arguments or an
export that cannot proceed (the message names the problem).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from reactantserver.export._errors import ExportError

__all__ = ["build_parser", "main"]

_PROG = "reactantserver-export"


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated ints, e.g. 1,8,32"
        ) from None
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes must be ints > 0")
    return sizes


def _variant(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for part in text.split(","):
        letter, sep, value = part.partition("=")
        letter = letter.strip()
        try:
            size = int(value)
        except ValueError:
            size = 0
        if not sep or len(letter) != 1 or not letter.isalpha() or size <= 0:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected LETTER=SIZE,… with sizes > 0, e.g. w=1024,h=768"
            )
        if letter in sizes:
            raise argparse.ArgumentTypeError(f"{text!r}: {letter} is sized twice")
        sizes[letter] = size
    return sizes


def _add_bundle_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="SPEC",
        help="NAME=DTYPE[AXES], e.g. x=f32[n,16] or image=f32[n,c=3,h=224,w=224] (repeat)",
    )
    parser.add_argument(
        "--output",
        action="append",
        metavar="NAME",
        help="output name in result order, or NAME=DTYPE[AXES] to declare its axes (repeat)",
    )
    parser.add_argument(
        "--batch-sizes", type=_batch_sizes, default=[], metavar="B,…", help="e.g. 1,8,32"
    )
    parser.add_argument("--platform", default="cpu", help="lowering platform (default: cpu)")
    parser.add_argument("--name", help="model name (default and required: basename of --out)")
    parser.add_argument("--out", required=True, type=Path, help="the bundle directory to write")
    parser.add_argument(
        "--with-hooks", action="store_true", help="write a model.py with identity hooks"
    )
    parser.add_argument(
        "--model-py", type=Path, metavar="FILE", help="copy FILE into the bundle as model.py"
    )
    parser.add_argument(
        "--client-input", action="append", metavar="SPEC", help="client input (needs hooks)"
    )
    parser.add_argument(
        "--client-output", action="append", metavar="SPEC", help="client output (needs hooks)"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing bundle")
    parser.add_argument("--description", default="", help="manifest description")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--text-copies", action="store_true", help="also write model….mlir.txt for reading"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``reactantserver-export``."""
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Export JAX/Flax/PyTorch models as ReactantServer bundles."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    jax_cmd = commands.add_parser("jax", help="export a JAX function fn(params, *inputs)")
    jax_cmd.add_argument("target", metavar="MODULE:FN")
    jax_cmd.add_argument(
        "--params",
        required=True,
        metavar="SPEC",
        help="path.safetensors, path.npz, or MODULE:ATTR (a pytree or a callable returning one)",
    )
    jax_cmd.add_argument(
        "--variant",
        action="append",
        type=_variant,
        default=[],
        metavar="L=SIZE,…",
        help="sizes of every variable axis for one compiled variant (repeat)",
    )
    jax_cmd.add_argument("--seed", type=int, default=0, help="seed for a --params factory")
    _add_bundle_options(jax_cmd)

    torch_cmd = commands.add_parser("torch", help="export a PyTorch nn.Module (extra torch)")
    torch_cmd.add_argument("target", metavar="MODULE:ATTR")
    torch_cmd.add_argument(
        "--strict", action="store_true", help="strict (TorchDynamo) torch.export capture"
    )
    _add_bundle_options(torch_cmd)

    flax_cmd = commands.add_parser("flax", help="export a Flax NNX module (extra flax)")
    flax_cmd.add_argument("target", metavar="MODULE:ATTR")
    _add_bundle_options(flax_cmd)

    check = commands.add_parser("validate", help="compile, run and check a bundle")
    check.add_argument("bundle", type=Path, metavar="DIR")
    check.add_argument("--reference", metavar="MODULE:FN", help="the original function")
    check.add_argument(
        "--params", metavar="SPEC", help="parameters for --reference (default: bundle weights)"
    )
    check.add_argument(
        "--params-seed", type=int, default=0, help="seed for a --params factory (default 0)"
    )
    check.add_argument("--rtol", type=float, default=1e-3)
    check.add_argument("--atol", type=float, default=1e-3)
    check.add_argument("--seed", type=int, default=1234, help="input seed (seed + B per module)")
    check.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    check.add_argument("--report", type=Path, metavar="PATH", help="also write Markdown here")
    return parser


def _bundle_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "outputs": args.output,
        "batch_sizes": args.batch_sizes,
        "out": args.out,
        "platform": args.platform,
        "name": args.name,
        "with_hooks": args.with_hooks,
        "force": args.force,
        "description": args.description,
        "progress": not args.no_progress,
        "client_inputs": args.client_input,
        "client_outputs": args.client_output,
        "model_py": args.model_py,
        "text_copies": args.text_copies,
        "provenance_extra": {"entry": args.target},
    }


def _run_jax(args: argparse.Namespace) -> int:
    from reactantserver.export._params import import_object, load_params

    fn = import_object(args.target, "MODULE:FN")
    if not callable(fn):
        raise ExportError(f"{args.target}: not callable")
    params = load_params(args.params, seed=args.seed)
    from reactantserver.export._export import export_jax

    path = export_jax(fn, params, args.input, variants=args.variant, **_bundle_kwargs(args))
    print(f"exported {path}")
    return 0


def _run_torch(args: argparse.Namespace) -> int:
    # torch and torchax load before anything imports jax.
    from reactantserver.export._torch import export_torch, torch_modules

    torch_modules()
    from reactantserver.export._params import import_object

    module = import_object(args.target)
    path = export_torch(module, args.input, strict=args.strict, **_bundle_kwargs(args))
    print(f"exported {path}")
    return 0


def _run_flax(args: argparse.Namespace) -> int:
    from reactantserver.export._flax import export_flax, nnx_module

    nnx_module()
    from reactantserver.export._params import import_object

    module = import_object(args.target)
    path = export_flax(module, args.input, **_bundle_kwargs(args))
    print(f"exported {path}")
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    from reactantserver.export._params import import_object, load_params

    if args.params and not args.reference:
        raise ExportError("--params is only used with --reference")
    reference = import_object(args.reference, "MODULE:FN") if args.reference else None
    params = load_params(args.params, seed=args.params_seed) if args.params else None
    from reactantserver.export._validate import validate

    report = validate(
        args.bundle,
        reference=reference,
        params=params,
        rtol=args.rtol,
        atol=args.atol,
        seed=args.seed,
        backend=args.backend,
    )
    print(report.to_text(), end="")
    if args.report is not None:
        args.report.write_text(report.to_markdown())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-export``; returns the process exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(level=logging.WARNING, format=f"{_PROG}: %(levelname)s: %(message)s")
    handlers = {
        "jax": _run_jax,
        "torch": _run_torch,
        "flax": _run_flax,
        "validate": _run_validate,
    }
    try:
        return handlers[args.command](args)
    except ExportError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
