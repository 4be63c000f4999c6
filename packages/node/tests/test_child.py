"""Child: one run of a real child process, its exit, and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from reactantserver.node._child import DRAIN_SECONDS, Child, describe_exit, http_status
from reactantserver.node._logmux import LogMux
from reactantserver.node._spec import ChildKind, ChildSpec


def _spec(program: str, *, name: str = "child", grace: float = 5.0) -> ChildSpec:
    return ChildSpec(
        name=name,
        kind=ChildKind.WORKER,
        argv=(sys.executable, "-c", program),
        env=dict(os.environ),
        grace_seconds=grace,
    )


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


async def _until(out: io.BytesIO, needle: bytes, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while needle not in out.getvalue():
            await asyncio.sleep(0.01)


def test_describe_exit() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-15) == "killed by SIGTERM"
    assert describe_exit(-200) == "killed by signal 200"


def test_start_pumps_output_and_wait_returns_the_code() -> None:
    out = io.BytesIO()

    async def main() -> None:
        child = Child(_spec("import sys; print('hi'); sys.exit(7)", name="w0"), LogMux(out))
        before = time.monotonic()
        await child.start()
        assert child.pid > 0
        assert before <= child.started_at <= time.monotonic()
        assert await child.wait() == 7
        assert await child.wait() == 7
        assert child.returncode == 7

    asyncio.run(main())
    assert out.getvalue() == b"[w0] hi\n"


def test_the_spec_env_is_the_whole_environment() -> None:
    out = io.BytesIO()
    spec = ChildSpec(
        name="env",
        kind=ChildKind.GATEWAY,
        argv=(sys.executable, "-c", "import os; print(sorted(os.environ.items()))"),
        env={"ONLY": "this"},
        grace_seconds=1.0,
    )

    async def main() -> None:
        child = Child(spec, LogMux(out))
        await child.start()
        assert await child.wait() == 0

    asyncio.run(main())
    assert b"('ONLY', 'this')" in out.getvalue()
    assert b"PATH" not in out.getvalue()


def test_stop_terminates_a_cooperative_child() -> None:
    out = io.BytesIO()

    async def main() -> None:
        child = Child(_spec("import time; print('up', flush=True); time.sleep(60)"), LogMux(out))
        await child.start()
        await _until(out, b"up")
        assert await child.stop() == -signal.SIGTERM
        assert not _alive(child.pid)

    asyncio.run(main())
    assert b"SIGKILL" not in out.getvalue()


def test_a_child_ignoring_sigterm_is_sigkilled_after_its_grace() -> None:
    out = io.BytesIO()
    program = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    async def main() -> None:
        child = Child(_spec(program, name="stubborn", grace=30.0), LogMux(out))
        await child.start()
        await _until(out, b"ready")
        started = time.monotonic()
        returncode = await child.stop(grace=0.3)
        assert 0.3 <= time.monotonic() - started < 5.0
        assert describe_exit(returncode) == "killed by SIGKILL"

    asyncio.run(main())
    assert b"[supervisor] sending SIGKILL to stubborn\n" in out.getvalue()


def test_an_exited_child_takes_its_process_group_along() -> None:
    # The grandchild inherits the pipes: wait() must not hang on them, and must kill it.
    out = io.BytesIO()
    program = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('grandchild', g.pid, flush=True)\n"
    )

    async def main() -> None:
        child = Child(_spec(program), LogMux(out))
        await child.start()
        await _until(out, b"grandchild")
        started = time.monotonic()
        assert await child.wait() == 0
        assert time.monotonic() - started < DRAIN_SECONDS
        grandchild = int(out.getvalue().split()[-1])
        async with asyncio.timeout(5):
            while _alive(grandchild):
                await asyncio.sleep(0.01)

    asyncio.run(main())
    assert b"still open" not in out.getvalue()


def test_stop_on_an_exited_child_returns_its_code() -> None:
    async def main() -> None:
        child = Child(_spec("pass"), LogMux(io.BytesIO()))
        await child.start()
        assert await child.wait() == 0
        assert await child.stop(grace=0) == 0

    asyncio.run(main())


def test_a_missing_executable_raises_oserror() -> None:
    spec = ChildSpec(
        name="ghost", kind=ChildKind.WORKER, argv=("/nonexistent/ghost",), grace_seconds=1.0
    )

    async def main() -> None:
        child = Child(spec, LogMux(io.BytesIO()))
        with pytest.raises(OSError, match="ghost"):
            await child.start()
        with pytest.raises(RuntimeError, match="not started"):
            await child.wait()

    asyncio.run(main())


def test_a_child_starts_only_once() -> None:
    async def main() -> None:
        child = Child(_spec("pass"), LogMux(io.BytesIO()))
        with pytest.raises(RuntimeError, match="not started"):
            _ = child.pid
        await child.start()
        with pytest.raises(RuntimeError, match="already started"):
            await child.start()
        await child.wait()

    asyncio.run(main())


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/healthz" else 500
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def _server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_http_status_reads_the_status_code() -> None:
    with _server() as port:
        base = f"http://127.0.0.1:{port}"
        assert asyncio.run(http_status(base + "/healthz", 2.0)) == 200
        assert asyncio.run(http_status(base + "/other?x=1", 2.0)) == 500
    # Nobody listens there any more.
    assert asyncio.run(http_status(base + "/healthz", 2.0)) is None
    with pytest.raises(ValueError, match="not an http URL"):
        asyncio.run(http_status("ftp://x/", 1.0))
