"""Merging Prometheus text expositions into one.

The gateway's ``/metrics`` is its own exposition followed by every worker's. The text format
wants each family once, with all its samples together, so this is a line-based merge: one
``# HELP`` and one ``# TYPE`` line per family (the first seen), then every source's samples of
that family in source order. Sample lines are copied verbatim, never re-rendered::

    body = merge_expositions([metrics.render(), worker0_body, worker1_body])

Rules chosen here:

* A sample belongs to the family of the latest ``# TYPE`` of its source when its name is one of
  that family's sample names (``_bucket``/``_sum``/``_count``/``_created`` for histograms, ...);
  otherwise to the family that already owns its name; otherwise it starts an ``untyped`` family
  of its own name (printed with ``# TYPE <name> untyped``). A later ``# TYPE`` for such a name
  adopts those samples.
* A ``# TYPE`` that contradicts the first one seen for that family drops that source's samples
  up to its next ``# HELP``/``# TYPE`` (mixing them would make the merged text unparseable).
* Other comments, blank lines and lines that do not start with a metric name are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["merge_expositions"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

#: Sample-name suffixes of each family type beyond the family name itself (text format 0.0.4
#: and the OpenMetrics names prometheus_client understands).
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", "_created"),
    "info": ("_info",),
}


class _Family:
    """One merged family: its first HELP/TYPE lines and every sample line, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.help: str | None = None
        self.type: str | None = None
        self.type_line: str | None = None
        self.samples: list[str] = []

    def sample_names(self) -> tuple[str, ...]:
        """Every sample name this family can hold (just its own name until it has a type)."""
        suffixes = _SUFFIXES.get(self.type or "", ())
        base = self.name
        if self.type == "counter" and base.endswith("_total"):
            base = base.removesuffix("_total")
        return (self.name, *(base + suffix for suffix in suffixes))

    def lines(self) -> list[str]:
        """The family's lines in the merged output."""
        head = [self.help] if self.help is not None else []
        head.append(self.type_line or f"# TYPE {self.name} untyped")
        return head + self.samples


class _Merger:
    """The merge state across sources: families in first-seen order, sample names indexed."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._owner: dict[str, _Family] = {}

    def add(self, text: str) -> None:
        current: _Family | None = None
        dropping = False
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("#"):
                parts = stripped.split(None, 3)
                if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                    continue
                family = self._family(parts[2])
                dropping = False
                if parts[1] == "HELP":
                    if family.help is None:
                        family.help = stripped
                elif len(parts) == 4:
                    dropping = not self._declare(family, parts[3].strip().lower(), stripped)
                current = family
                continue
            match = _NAME.match(stripped)
            if dropping or match is None:
                continue
            name = match.group()
            if current is None or name not in current.sample_names():
                target = self._owner.get(name) or self._family(name)
            else:
                target = current
            target.samples.append(line)

    def _family(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name)
            self._owner.setdefault(name, family)
        return family

    def _declare(self, family: _Family, kind: str, line: str) -> bool:
        """Type ``family`` (first TYPE wins); ``False`` when ``kind`` contradicts its type."""
        if family.type is not None:
            return family.type == kind
        family.type, family.type_line = kind, line
        for name in family.sample_names():
            owner = self._owner.get(name)
            if owner is family or (owner is not None and owner.type is not None):
                continue
            if owner is not None:
                # An untyped family of one of our sample names: its lines are ours.
                family.samples.extend(owner.samples)
                del self._families[owner.name]
            self._owner[name] = family
        return True

    def text(self) -> str:
        lines = [line for family in self._families.values() for line in family.lines()]
        return "".join(line + "\n" for line in lines)


def merge_expositions(sources: Sequence[bytes | str]) -> str:
    """One Prometheus text exposition holding every family and sample of ``sources``.

    Bytes are decoded as UTF-8 (undecodable bytes replaced). Families appear in first-seen
    order, each with one ``# HELP`` (when any source has one) and one ``# TYPE`` line; sample
    lines keep their source order and their exact text.
    """
    merger = _Merger()
    for source in sources:
        text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
        merger.add(text)
    return merger.text()
