"""``python -m reactantserver.gateway`` (how the node supervisor starts the gateway)."""

from __future__ import annotations

from reactantserver.gateway._cli import main

raise SystemExit(main())
