"""``python -m reactantserver.worker``: the same as the ``reactantserver-worker`` script."""

from __future__ import annotations

from reactantserver.worker._cli import main

raise SystemExit(main())
