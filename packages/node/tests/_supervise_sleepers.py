"""Test driver: supervise two sleeping children until SIGTERM (see ``test_supervisor``).

``sleeper`` spawns a grandchild (which only its process group reaches) and ``stubborn``
ignores SIGTERM; both print ``pids ...`` once up. The exit code is ``Supervisor.run()``'s.
"""

from __future__ import annotations

import asyncio
import os
import sys

from reactantserver.core.config import SupervisorConfig
from reactantserver.node._logmux import LogMux
from reactantserver.node._spec import ChildKind, ChildSpec
from reactantserver.node._supervisor import Supervisor

SLEEPER = (
    "import os, subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('pids', os.getpid(), g.pid, flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('pids', os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)


def main() -> int:
    """Run the supervisor on the two children; its exit code."""
    specs = [
        ChildSpec(
            name=name,
            kind=ChildKind.WORKER,
            argv=(sys.executable, "-c", program),
            env=dict(os.environ),
            grace_seconds=0.5,
        )
        for name, program in (("sleeper", SLEEPER), ("stubborn", STUBBORN))
    ]
    mux = LogMux(sys.stdout.buffer)
    mux.supervisor(f"driver pid {os.getpid()}")
    return asyncio.run(Supervisor(specs, SupervisorConfig(), mux, role="workers").run())


if __name__ == "__main__":
    sys.exit(main())
