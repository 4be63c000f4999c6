"""The two server subprocesses of ``bench.worker_grpc``: the worker and the bare server.

Each runs from the repository root with its output in a log file; readiness is polled with
stock ``tritonclient.grpc`` and the process stops on SIGTERM. CPU time is read per thread from
``/proc`` (Linux) and added up by thread group, and the worker's ``ModelStatistics`` are read
as plain counters, so a run can say where the server's time went.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._common import free_port

__all__ = [
    "STOP_TIMEOUT_S",
    "Server",
    "cpu_split",
    "executions_by_batch",
    "export_examples",
    "metric_sums",
    "model_stats",
    "start_bare",
    "start_worker",
    "thread_cpu",
]

ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_group(pid: int, tid: int, comm: str, main_comm: str) -> str:
    if tid == pid:
        return "main"  # the event loop's thread
    if comm == main_comm:
        return "python"  # Python threads (dispatch, hook pool, grpc.aio's poller) keep it
    if comm.startswith(("event_engine", "grpc")):
        return "grpc"
    return "other"


def thread_cpu(pid: int) -> dict[str, float] | None:
    """User + system CPU seconds of process ``pid`` by thread group (see
    :func:`_thread_group`); None off Linux or once the process is gone."""
    groups: dict[str, float] = {}
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        main_comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # exited since the listing
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        # fields[0] is the state (field 3 of stat(5)); utime and stime are fields 14 and 15.
        fields = stat.rsplit(")", 1)[1].split()
        group = _thread_group(pid, tid, comm, main_comm)
        groups[group] = groups.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return groups


class Server:
    """A server subprocess (the worker or the bare server) with its log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        port: int,
        log: Path,
        *,
        cpus: frozenset[int] | None = None,
        http_port: int | None = None,
    ):
        self.name = name
        self.port = port
        self.url = f"127.0.0.1:{port}"
        #: The worker's HTTP port (``/metrics``), where the server has one.
        self.http_url = None if http_port is None else f"http://127.0.0.1:{http_port}"
        self.log = log
        self.cpus = cpus
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.pin()

    def pin(self) -> None:
        """Restrict every thread of the server to ``cpus`` (threads it starts later inherit).

        Done right after the start (before the interpreter has started any thread) and again
        once it is ready.
        """
        if self.cpus is None:
            return
        try:
            tids = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            tids = [str(self.proc.pid)]
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), self.cpus)
            except OSError:
                continue  # exited meanwhile

    def cpu_seconds(self) -> dict[str, float] | None:
        """CPU seconds the server process has used so far, by thread group."""
        return thread_cpu(self.proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output."""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(self, models: Sequence[str], timeout_s: float) -> float:
        """Poll ``is_server_ready`` (then each model's readiness); returns the seconds taken."""
        import tritonclient.grpc as grpcclient

        start = time.perf_counter()
        deadline = start + timeout_s
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with status {self.proc.returncode} before it was "
                        f"ready; its output:\n{self.log_tail()}"
                    )
                try:
                    if client.is_server_ready(client_timeout=2.0) and all(
                        client.is_model_ready(m, client_timeout=2.0) for m in models
                    ):
                        self.pin()
                        return time.perf_counter() - start
                except Exception:  # not listening yet
                    pass
                if time.perf_counter() > deadline:
                    raise TimeoutError(
                        f"{self.name} not ready after {timeout_s:g} s; its output:\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> int | None:
        """SIGTERM, wait (kill after ``STOP_TIMEOUT_S``); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


#: One sample line of the Prometheus text format: the series name, its labels, its value.
_SAMPLE = re.compile(r"^(\w+)(?:\{[^}]*\})? (\S+)$")


def metric_sums(server: Server, names: Collection[str]) -> dict[str, float]:
    """The series ``names`` of ``server``'s ``/metrics`` now, each summed over its labels
    (a series the server does not report is absent)."""
    assert server.http_url is not None
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match[1] in names:
            out[match[1]] = out.get(match[1], 0.0) + float(match[2])
    return out


def start_bare(
    tmp: Path, cpus: frozenset[int] | None, *, handoff: bool = False, native: bool = False
) -> Server:
    """Start ``python -m bench._bare_server`` on a free port, its output in ``tmp/bare.log``
    (``handoff``: answers through a second thread, ``tmp/bare-handoff.log``; ``native``: on
    the worker's front door instead of ``grpc.aio``, ``tmp/bare-native.log``)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench._bare_server", "--port", str(port)]
    name, log = "bare server", tmp / "bare.log"
    if handoff:
        argv.append("--handoff")
        name, log = "bare server with a thread hand-off", tmp / "bare-handoff.log"
    elif native:
        argv.append("--native")
        name, log = "bare server on the native front", tmp / "bare-native.log"
    return Server(name, argv, dict(os.environ), port, log, cpus=cpus)


def _worker_module() -> str:
    # ``python -m reactantserver.worker`` needs worker/__main__.py; the console script's
    # module is the fallback while it is missing.
    if importlib.util.find_spec("reactantserver.worker.__main__") is not None:
        return "reactantserver.worker"
    return "reactantserver.worker._cli"


def start_worker(
    tmp: Path, models: Path, extra_env: Mapping[str, str], cpus: frozenset[int] | None
) -> Server:
    """Start ``python -m reactantserver.worker --model-repo models`` on free ports.

    Static model control (no repository polling), CPU backend, warnings-only logs, its
    executable cache under ``tmp``; ``extra_env`` (``REACTANTSERVER_WORKER_*`` overrides) last.
    """
    port = free_port()
    env = dict(os.environ)
    env.update(
        REACTANTSERVER_WORKER_ENDPOINTS_PORT=str(port),
        REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT=str(free_port()),
        REACTANTSERVER_WORKER_ENDPOINTS_HTTP_PORT="0",  # REST on the metrics port
        REACTANTSERVER_WORKER_MODEL_CONTROL_MODE="static",
        REACTANTSERVER_WORKER_RUNTIME_BACKEND="cpu",
        REACTANTSERVER_WORKER_CACHE_DIR=str(tmp / "cache"),
        REACTANTSERVER_WORKER_LOGGING_LEVEL="warning",
    )
    env.update(extra_env)
    argv = [sys.executable, "-m", _worker_module(), "--model-repo", str(models)]
    http_port = int(env["REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT"])
    return Server("worker", argv, env, port, tmp / "worker.log", cpus=cpus, http_port=http_port)


def cpu_split() -> tuple[frozenset[int], frozenset[int]] | None:
    """(client CPUs, server CPUs): the first CPU this process may use, and the others.

    None where affinity cannot be set or fewer than two CPUs are available.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    return frozenset(allowed[:1]), frozenset(allowed[1:])


def export_examples(models: Path, names: Sequence[str]) -> None:
    """Export the ``examples/<name>`` bundles into ``models/<name>``."""
    for name in names:
        subprocess.run(
            [
                sys.executable,
                "-m",
                f"examples.{name}.export",
                "--out",
                str(models),
                "--no-progress",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )


#: ModelStatistics counters read by :func:`model_stats` (``*_ns`` are durations).
_STATS = ("inference_count", "execution_count")
_DURATIONS = ("queue", "compute_input", "compute_infer", "compute_output")


def _statistics(url: str, model: str) -> Any:
    """The worker's ``ModelStatistics`` message for ``model``; None if it cannot answer."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        return client.get_inference_statistics(model, client_timeout=5.0).model_stats[0]
    except Exception:  # a worker without statistics still gets benchmarked
        return None
    finally:
        client.close()


def model_stats(url: str, model: str) -> dict[str, int] | None:
    """The worker's ``ModelStatistics`` counters for ``model``; None if it cannot answer."""
    stats = _statistics(url, model)
    if stats is None:
        return None
    out = {name: int(getattr(stats, name)) for name in _STATS}
    for name in _DURATIONS:
        out[f"{name}_ns"] = int(getattr(stats.inference_stats, name).ns)
    return out


def executions_by_batch(url: str, model: str) -> dict[int, int] | None:
    """Executions so far per compiled batch size (``ModelStatistics.batch_stats``) of ``model``;
    None if the worker cannot answer."""
    stats = _statistics(url, model)
    if stats is None:
        return None
    return {int(b.batch_size): int(b.compute_infer.count) for b in stats.batch_stats}
