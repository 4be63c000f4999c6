"""The export progress bar: one step per lowered module plus the weights write (tqdm, stderr).

Shown only when enabled and stderr is a terminal, so logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

__all__ = ["Progress"]


class Progress:
    """A progress display of ``total`` steps, or a silent stand-in when it is not wanted."""

    def __init__(self, total: int, description: str, *, enabled: bool = True) -> None:
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            self._bar = tqdm(total=total, desc=description, unit="step", file=sys.stderr)

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn."""
        return self._bar is not None

    def step(self, what: str = "") -> None:
        """Advance by one step; ``what`` is shown next to the bar."""
        if self._bar is not None:
            if what:
                self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        """Finish the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
