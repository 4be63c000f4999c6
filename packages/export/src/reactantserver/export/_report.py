"""The result of ``validate``: per module and output, printable as text or Markdown."""

from __future__ import annotations

from pathlib import Path

import attrs

__all__ = ["ModuleReport", "OutputReport", "ValidationReport"]


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


@attrs.define
class OutputReport:
    """One output of one module run: where it was checked and how far off it was.

    ``stage`` is ``executable`` (the module's result) or ``client`` (after ``postprocess``);
    the errors are against the reference, ``None`` without one.
    """

    name: str
    stage: str
    shape: tuple[int, ...]
    dtype: str
    ok: bool
    max_abs: float | None = None
    max_rel: float | None = None
    note: str = ""


@attrs.define
class ModuleReport:
    """One module file: servable or not, the problems found, and its outputs."""

    file: str
    variant: int | None
    batch_size: int
    servable: bool = True
    ran: bool = False
    problems: list[str] = attrs.Factory(list)
    outputs: list[OutputReport] = attrs.Factory(list)

    @property
    def status(self) -> str:
        """``servable`` or ``UNSERVABLE``."""
        return "servable" if self.servable else "UNSERVABLE"

    @property
    def ok(self) -> bool:
        """Whether the module passed every check."""
        return self.servable and not self.problems and all(o.ok for o in self.outputs)


@attrs.define
class ValidationReport:
    """Everything ``validate`` found about one bundle; :attr:`ok` decides the exit status."""

    bundle: Path
    kind: str = "model"
    reference: bool = False
    rtol: float = 1e-3
    atol: float = 1e-3
    seed: int = 1234
    backend: str = "cpu"
    problems: list[str] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)
    modules: list[ModuleReport] = attrs.Factory(list)

    @property
    def ok(self) -> bool:
        """Whether the bundle passed: no bundle-level problem and every module passed."""
        return not self.problems and all(m.ok for m in self.modules)

    def _rows(self) -> list[list[str]]:
        rows = []
        for module in self.modules:
            if not module.outputs:
                rows.append(
                    [module.file, module.status, "-", "-", "-", "-", "-", _verdict(module.ok)]
                )
            for out in module.outputs:
                rows.append(
                    [
                        module.file,
                        module.status,
                        f"{out.name} ({out.stage})",
                        "[" + ",".join(map(str, out.shape)) + "]",
                        out.dtype,
                        _err(out.max_abs),
                        _err(out.max_rel),
                        _verdict(out.ok) + (f": {out.note}" if out.note else ""),
                    ]
                )
        return rows

    def _header_lines(self) -> list[str]:
        compare = (
            f"reference, rtol {self.rtol:g}, atol {self.atol:g}"
            if self.reference
            else "no reference: shapes, dtypes and finiteness"
        )
        return [
            f"bundle {self.bundle} (kind: {self.kind}) on {self.backend}, seed {self.seed}, "
            f"{compare}"
        ]

    def _problem_lines(self) -> list[str]:
        lines = [f"FAIL: {p}" for p in self.problems]
        for module in self.modules:
            lines += [f"FAIL: {module.file}: {p}" for p in module.problems]
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def to_text(self) -> str:
        """A plain-text table (the CLI prints it)."""
        header = [
            "module",
            "status",
            "output",
            "shape",
            "dtype",
            "max abs err",
            "max rel err",
            "result",
        ]
        rows = self._rows()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = self._header_lines()
        if rows:
            lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines += self._problem_lines()
        lines.append("PASSED" if self.ok else "FAILED")
        return "\n".join(line.rstrip() for line in lines) + "\n"

    def to_markdown(self) -> str:
        """The same report as a Markdown document."""
        lines = [f"# Validation of `{self.bundle.name}`", "", *self._header_lines(), ""]
        rows = self._rows()
        if rows:
            lines += [
                "| module | status | output | shape | dtype | max abs err | max rel err | result |",
                "|---|---|---|---|---|---|---|---|",
            ]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
            lines.append("")
        problems = self._problem_lines()
        if problems:
            lines += [f"- {p}" for p in problems] + [""]
        lines.append(f"**{'PASSED' if self.ok else 'FAILED'}**")
        return "\n".join(lines) + "\n"


def _verdict(ok: bool) -> str:
    return "ok" if ok else "FAIL"
