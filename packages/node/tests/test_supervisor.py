"""Supervisor: restarts, crash budget, liveness, signals and a clean shutdown."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from reactantserver.core.config import SupervisorConfig
from reactantserver.node._logmux import LogMux
from reactantserver.node._spec import ChildKind, ChildSpec
from reactantserver.node._supervisor import RestartBudget, Supervisor, backoff_seconds

SLEEP = "import time; print('up', flush=True); time.sleep(60)"


def _spec(
    name: str, program: str, *args: str, grace: float = 2.0, http_port: int | None = None
) -> ChildSpec:
    return ChildSpec(
        name=name,
        kind=ChildKind.WORKER,
        argv=(sys.executable, "-c", program, *args),
        env=dict(os.environ),
        grace_seconds=grace,
        http_port=http_port,
    )


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _pids(log: bytes) -> list[int]:
    return [int(pid) for pid in re.findall(rb"\(pid (\d+),", log)]


def _supervise(
    specs: Sequence[ChildSpec],
    policy: SupervisorConfig,
    *,
    until: bytes | None = None,
    count: int = 1,
    timeout: float = 20.0,
) -> tuple[int, bytes]:
    """Run a Supervisor; with ``until``, request shutdown once the log has it ``count`` times."""
    out = io.BytesIO()

    async def main() -> int:
        supervisor = Supervisor(specs, policy, LogMux(out), notes=["a note"])
        async with asyncio.timeout(timeout):
            run = asyncio.create_task(supervisor.run())
            if until is not None:
                while out.getvalue().count(until) < count and not run.done():
                    await asyncio.sleep(0.01)
                supervisor.request_shutdown()
                supervisor.request_shutdown()
            code = await run
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return code

    code = asyncio.run(main())
    log = out.getvalue()
    for pid in _pids(log):
        assert not _alive(pid)
    return code, log


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_seconds(n, 30.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_seconds(10_000, 30.0) == 30.0
    assert backoff_seconds(1, 0.2) == 0.2
    with pytest.raises(ValueError, match="counter"):
        backoff_seconds(0, 30.0)


def test_restart_budget_runs_out_after_max_restarts() -> None:
    budget = RestartBudget(max_restarts=2, stable_uptime_seconds=60, max_backoff_seconds=30)
    assert budget.on_exit(0.5) == 1.0
    assert budget.on_exit(0.5) == 2.0
    assert budget.on_exit(0.5) is None
    assert budget.consecutive == 3


def test_restart_budget_resets_after_a_stable_run() -> None:
    budget = RestartBudget.from_policy(SupervisorConfig(max_restarts=2))
    assert budget.on_exit(1.0) == 1.0
    assert budget.on_exit(1.0) == 2.0
    assert budget.on_exit(60.0) == 1.0
    assert budget.consecutive == 1


def test_unlimited_restarts_never_run_out() -> None:
    budget = RestartBudget(max_restarts=0, stable_uptime_seconds=60, max_backoff_seconds=30)
    assert [budget.on_exit(0) for _ in range(8)][-3:] == [30.0, 30.0, 30.0]


def test_a_crash_loop_exhausts_the_budget_and_stops_the_node() -> None:
    policy = SupervisorConfig(max_restarts=2, max_backoff_seconds=0.2)
    specs = [_spec("crash", "import sys; sys.exit(3)"), _spec("steady", SLEEP, http_port=9)]
    code, log = _supervise(specs, policy, timeout=10.0)
    assert code == 1
    assert b"[supervisor] role all; 2 children\n" in log
    assert b"[supervisor] a note\n" in log
    assert log.count(b"[supervisor] started crash (pid ") == 3
    assert re.search(rb"started steady \(pid \d+, HTTP port 9\)", log)
    assert log.count(b"[supervisor] restarting crash in 0.2 s\n") == 2
    assert len(re.findall(rb"crash exited with code 3 after \d+\.\d s\n", log)) == 3
    assert b"[supervisor] crash failed 3 consecutive times; shutting the node down\n" in log
    assert b"steady killed by SIGTERM after" in log
    assert b"restarting steady" not in log
    assert log.endswith(b"[supervisor] shutdown complete (exit code 1)\n")


def test_a_stable_uptime_resets_the_count() -> None:
    # One restart allowed, but every run lasts past stable_uptime: the budget never runs out.
    policy = SupervisorConfig(max_restarts=1, stable_uptime_seconds=0.2, max_backoff_seconds=0.05)
    program = "import sys, time; time.sleep(0.3); sys.exit(1)"
    code, log = _supervise([_spec("flaky", program)], policy, until=b"started flaky", count=3)
    assert code == 0
    assert log.count(b"restarting flaky in 0.05 s") >= 2
    assert b"consecutive" not in log


def test_a_spawn_failure_counts_as_a_crash() -> None:
    ghost = ChildSpec(
        name="ghost", kind=ChildKind.WORKER, argv=("/nonexistent/ghost",), grace_seconds=1.0
    )
    policy = SupervisorConfig(max_restarts=1, max_backoff_seconds=0.05)
    code, log = _supervise([ghost], policy, timeout=10.0)
    assert code == 1
    assert log.count(b"[supervisor] failed to start ghost: ") == 2
    assert b"ghost failed 2 consecutive times" in log


def test_shutdown_interrupts_the_backoff() -> None:
    policy = SupervisorConfig(max_backoff_seconds=30.0)
    started = time.monotonic()
    code, log = _supervise(
        [_spec("crash", "import sys; sys.exit(1)")], policy, until=b"restarting crash in 1 s"
    )
    assert code == 0
    assert time.monotonic() - started < 5.0
    assert log.count(b"started crash") == 1


def test_request_shutdown_before_run_starts_nothing() -> None:
    async def main() -> int:
        supervisor = Supervisor([_spec("idle", SLEEP)], SupervisorConfig(), LogMux(out))
        supervisor.request_shutdown()
        assert supervisor.shutting_down
        return await supervisor.run()

    out = io.BytesIO()
    assert asyncio.run(main()) == 0
    assert b"started" not in out.getvalue()


WEB = """
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, marker = int(sys.argv[1]), sys.argv[2]
healthy_for = None if os.path.exists(marker) else 3
open(marker, "a").close()

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        global healthy_for
        ok = healthy_for is None or healthy_for > 0
        if healthy_for:
            healthy_for -= 1
        self.send_response(200 if ok else 500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_liveness_failures_restart_the_child(tmp_path: Path) -> None:
    port, mute_port = _free_port(), _free_port()
    marker = tmp_path / "restarted"
    specs = [
        _spec("web", WEB, str(port), str(marker), http_port=port),
        # Never answers, so it is never declared dead.
        _spec("mute", SLEEP, http_port=mute_port),
    ]
    policy = SupervisorConfig(liveness_interval_seconds=0.05, liveness_failures=2)
    code, log = _supervise(specs, policy, until=b"started web", count=2)
    assert code == 0
    assert b"[supervisor] web liveness probe failed (status 500)\n" in log
    assert b"[supervisor] web failed 2 liveness probes in a row; stopping it\n" in log
    assert b"web killed by SIGTERM after" in log
    assert b"restarting web in 1 s" in log
    assert b"mute liveness" not in log
    assert log.count(b"started mute") == 1


def test_sigint_in_process_shuts_down_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out = io.BytesIO()

    async def main() -> int:
        supervisor = Supervisor([_spec("idle", SLEEP)], SupervisorConfig(), LogMux(out))
        run = asyncio.create_task(supervisor.run())
        async with asyncio.timeout(10):
            while b"[idle] up" not in out.getvalue():
                await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return await run

    assert asyncio.run(main()) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    log = out.getvalue()
    assert log.count(b"received SIGINT") == 1
    assert b"idle killed by SIGTERM" in log


def test_sigterm_to_a_supervisor_process_leaves_nothing_running() -> None:
    driver = Path(__file__).with_name("_supervise_sleepers.py")
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        pids: list[int] = []
        lines: list[bytes] = []
        while sum(b"] pids " in line for line in lines) < 2:
            line = proc.stdout.readline()
            assert line, b"".join(lines)
            lines.append(line)
            if b"] pids " in line:
                pids += [int(pid) for pid in line.split()[2:]]
        assert len(pids) == 3
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = b"".join(lines) + rest
    assert proc.returncode == 0, log
    assert log.count(b"[supervisor] received SIGTERM; shutting down\n") == 1
    assert b"[supervisor] sending SIGKILL to stubborn\n" in log
    assert b"stubborn killed by SIGKILL" in log
    assert b"sleeper killed by SIGTERM" in log
    assert log.endswith(b"[supervisor] shutdown complete (exit code 0)\n")
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [pid for pid in pids if _alive(pid)] == []
