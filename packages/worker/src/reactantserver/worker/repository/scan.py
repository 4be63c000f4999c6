"""The repository scan: which bundle directories this worker serves.

Bundles are the immediate subdirectories of each root holding a ``manifest.yaml``; hidden,
``.tmp`` and ``.old`` entries are skipped, invalid model names are skipped with a warning,
``models_include`` filters by name, and a name found under two roots fails in both::

    found = scan_model_dirs([Path("/models")], include=())
    found.bundles      # {"mlp": Path("/models/mlp"), ...}
    found.conflicts    # {"dup": "found in /a and /b"}
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

import attrs

from reactantserver.core.manifest import MANIFEST_FILENAME, is_bundle_dir_name, is_valid_model_name
from reactantserver.worker.repository.digest import BundleDigester, dir_identity
from reactantserver.worker.repository.reconcile import Seen

__all__ = ["ScanResult", "observe", "scan_model_dirs"]

_log = logging.getLogger("reactantserver.worker.scan")
_unsettled = itertools.count()


@attrs.frozen
class ScanResult:
    """Bundle directories by model name, and names that cannot load with the reason."""

    bundles: dict[str, Path]
    conflicts: dict[str, str]
    unreadable: tuple[Path, ...] = ()
    """Roots that could not be listed (skipped with a warning; their models are kept)."""


def _bundles_in(root: Path) -> list[Path] | None:
    try:
        children = sorted(root.iterdir())
    except OSError as exc:
        _log.warning("model directory %s cannot be read: %s; skipped", root, exc)
        return None
    found = []
    for child in children:
        if not is_bundle_dir_name(child.name) or not (child / MANIFEST_FILENAME).is_file():
            continue
        if not is_valid_model_name(child.name):
            _log.warning(
                "bundle directory %s: %r is not a valid model name; skipped", child, child.name
            )
            continue
        found.append(child)
    return found


def scan_model_dirs(roots: Sequence[Path], *, include: Sequence[str] = ()) -> ScanResult:
    """Scan ``roots`` in order; ``include`` (non-empty) keeps only those names."""
    seen: dict[str, list[Path]] = {}
    unreadable: list[Path] = []
    for root in roots:
        found = _bundles_in(root)
        if found is None:
            unreadable.append(root)
            continue
        for bundle in found:
            seen.setdefault(bundle.name, []).append(bundle)
    wanted = set(include)
    if wanted:
        for missing in sorted(wanted - set(seen)):
            _log.warning("models_include names %r, which no model directory holds", missing)
        seen = {name: paths for name, paths in seen.items() if name in wanted}
    bundles: dict[str, Path] = {}
    conflicts: dict[str, str] = {}
    for name, paths in sorted(seen.items()):
        if len(paths) == 1:
            bundles[name] = paths[0]
        else:
            where = " and ".join(str(p.parent) for p in paths)
            conflicts[name] = f"model {name!r} is found in {where}; rename one"
            _log.error("%s", conflicts[name])
    return ScanResult(bundles, conflicts, tuple(unreadable))


def observe(found: ScanResult, digester: BundleDigester) -> dict[str, Seen]:
    """Digest every scanned bundle; one that changes under the walk gets a one-off digest."""
    seen: dict[str, Seen] = {}
    for name, path in found.bundles.items():
        try:
            identity = dir_identity(path)
            digest = digester.digest(path)
        except OSError as exc:
            _log.info("bundle %s is changing (%s); looking again next poll", path, exc)
            digester.forget(path)
            try:
                identity = dir_identity(path)
            except OSError:
                continue  # gone again: absent this poll
            digest = f"unsettled-{next(_unsettled)}"  # never equal on two polls
        seen[name] = Seen(path, identity, digest)
    return seen
