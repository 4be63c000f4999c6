"""``python -m reactantserver.node``: the same as ``reactantserver-node``."""

from __future__ import annotations

from reactantserver.node._cli import main

raise SystemExit(main())
