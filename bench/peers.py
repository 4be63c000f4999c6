"""Peers benchmark: PyTriton, KServe and MLServer against our worker, same MLPs, same load.

Run from the repository root with the dev environment::

    .venv/bin/python -m bench.peers --prepare     # once, needs PyPI: the peers' venvs
    .venv/bin/python -m bench.peers               # ~9 min on the 2-core machine

Every server serves the tiny (64-64-16) and heavy (1024-4096-4096-1000) MLPs of
:mod:`bench._peers.models` (same function, same seeded weights, input ``x``, output ``y``),
one batch of up to 32 rows per execution: PyTriton with Triton's dynamic batcher (1 ms),
KServe without batching (it has none), MLServer with adaptive batching (1 ms), and our worker
(``python -m reactantserver.worker``, default configuration) last. Each peer runs in its own
venv under ``build/peers/`` (``--prepare`` makes them; a run never downloads, and a peer
whose venv is missing is reported unavailable with the reason while the others run). All
servers run pinned to the CPUs other than this process's. Stock ``tritonclient.grpc.aio``
drives each at ``--concurrency`` closed-loop one-row clients, every server in turn in each
(model, concurrency) cell, for ``--rounds`` rounds. Reported per server and cell: req/s,
p50/p99, server CPU per request over its whole process tree, and rows per execution (counted
inside the peers' model functions, from ModelStatistics for ours); and per round the raw
executable's rows/s at batch 1, 8 and 32, each cell's cap. Figures: ours / the best peer's
req/s, p99 against that peer's, ours / the raw cap where it binds.

The *floor* (``floor``; ``--no-floor`` leaves it out) is measured first in every cell:
``python -m bench._bare_server --native``, our front door answering every call with a canned
response of the model's output shape, no decoding and no model. It is what this client and
this front allow in the cell at all: where ``floor / best peer`` is under 1.5, the 1.5x target
is beyond any server on our front, whatever its model path costs. It is never a peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._common import free_port, loadavg, machine, write_report
from bench._grpc_load import CpuSampler, Signature, run_load
from bench._grpc_servers import Server, cpu_split, model_stats, start_bare, start_worker
from bench._peers import cells as numbers
from bench._peers.counters import Counter, counter_path
from bench._peers.markdown import markdown
from bench._peers.models import INPUT, MAX_BATCH, MODELS, OUTPUT
from bench._peers.servers import start_peer
from bench._peers.spec import PeerSpec
from bench._peers.venvs import PEERS, PEERS_DIR, Readiness, check, prepare
from bench._suite_plots import plot_peers

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = "peers-cpu"
OURS = "reactantserver"
FLOOR = "floor"
Counts = Callable[[], tuple[int, int] | None]
#: (window s, warm-up s, rounds, raw s per point, idle s) per size.
SIZES = {
    "quick": (0.3, 0.2, 1, 0.1, 0.5),
    "suite": (1.0, 0.5, 3, 0.3, 2.0),
    "full": (3.0, 0.5, 5, 1.0, 3.0),
}


class Probe:
    """The window's CPU sampler, also reading the server's execution counters at each edge."""

    def __init__(self, cpu: CpuSampler, counts: Counts) -> None:
        self._cpu, self._counts = cpu, counts
        self.marks: list[tuple[int, int] | None] = []

    def __call__(self) -> Mapping[str, float] | None:
        """The server's CPU seconds by group, after noting its counters."""
        self.marks.append(self._counts())
        return self._cpu()

    def executions_and_rows(self) -> tuple[int, int] | tuple[None, None]:
        """(executions, rows) between the last two edges."""
        if len(self.marks) < 2 or self.marks[-2] is None or self.marks[-1] is None:
            return None, None
        (e0, r0), (e1, r1) = self.marks[-2], self.marks[-1]
        return e1 - e0, r1 - r0


def _signature(model: str) -> Signature:
    mlp = MODELS[model]
    return (INPUT, (1, mlp.in_features), OUTPUT, (1, mlp.out_features))


def _our_counts(server: Server, model: str) -> Counts:
    def read() -> tuple[int, int] | None:
        stats = model_stats(server.url, model)
        return None if stats is None else (stats["execution_count"], stats["inference_count"])

    return read


def _window(
    args: argparse.Namespace, name: str, server: Server, *, counts: Counts, model: str, c: int
) -> dict[str, Any]:
    probe = Probe(server.cpu_seconds, counts)
    load = run_load(
        server.url,
        model,
        concurrency=c,
        kind=args.client,
        warmup_s=args.warmup,
        duration_s=args.duration,
        server_cpu=probe,
        signature=_signature(model),
    )
    executions, rows = probe.executions_and_rows()
    n, cpu, total = load.requests, load.server_cpu, load.server_cpu_s
    row: dict[str, Any] = {
        "server": name,
        **load.summary(),
        "server_cpu_us_per_request": total / n * 1e6 if total is not None and n else None,
        "server_cpu_us_per_request_by_process": (
            {k: v / n * 1e6 for k, v in sorted(cpu.items())} if cpu and n else {}
        ),
        "executions": executions,
        "rows": rows,
    }
    print(
        f"{name:15s} {model:9s} c={c:<3d}{row['requests_per_s']:8,.0f} req/s  p50 "
        f"{row['p50_ms']:6.2f} p99 {row['p99_ms']:6.2f} ms  CPU "
        f"{row['server_cpu_us_per_request'] or 0:6,.0f} us/req  rows/exec "
        f"{(rows or 0) / executions if executions else float('nan'):.2f}  errors {load.errors}",
        flush=True,
    )
    return row


def _raw(args: argparse.Namespace, cpus: frozenset[int] | None) -> dict[str, Any]:
    batches = sorted({numbers.cap_batch(c) for c in args.concurrency})
    argv = [sys.executable, "-m", "bench._peers.raw", "--models", *args.models]
    argv += ["--batches", *map(str, batches), "--seconds", str(args.raw_seconds)]
    if cpus:
        argv += ["--cpus", *map(str, sorted(cpus))]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    points: dict[str, Any] = json.loads(done.stdout)
    return points


def _start_peers(
    args: argparse.Namespace, ready: dict[str, Readiness], tmp: Path, cpus: frozenset[int] | None
) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    for name, state in ready.items():
        if state.python is None:
            continue
        for model in args.models:
            Counter.create(counter_path(tmp, name, model))
        spec = PeerSpec(
            name, free_port(), free_port(), free_port(), tuple(args.models), str(tmp), MAX_BATCH
        )
        spec_file = spec.write(tmp / f"{name}.json")
        log = tmp / f"{name}.log"
        servers[name] = start_peer(state.python, PEERS[name].module, spec_file, log, cpus=cpus)
    return servers


def _wait(
    args: argparse.Namespace, servers: dict[str, Server], ready: dict[str, Readiness]
) -> None:
    """Wait for every server; a peer that does not come up is stopped and marked unavailable."""
    for name, server in list(servers.items()):
        try:
            server.wait_ready(args.models, args.startup_timeout)
        except (RuntimeError, TimeoutError) as exc:
            if name in (OURS, FLOOR):
                raise
            server.stop()
            del servers[name]
            tail = " | ".join(str(exc).splitlines()[-6:])
            ready[name] = Readiness(name, None, f"did not start: {tail}", ready[name].installed)


def _idle_cpu(servers: Mapping[str, Server], seconds: float) -> dict[str, float | None]:
    """Each ready server's CPU while no one sends it anything, in % of one core: what the
    idle servers take from the one being measured (they share its core)."""
    before = {n: s.cpu_seconds() for n, s in servers.items()}
    time.sleep(seconds)
    after = {n: s.cpu_seconds() for n, s in servers.items()}
    idle: dict[str, float | None] = {}
    for name in servers:
        b, a = before[name], after[name]
        idle[name] = None if a is None or b is None else (sum(a.values()) - sum(b.values()))
    return {n: None if v is None else v / seconds * 100 for n, v in idle.items()}


def _servers_info(
    ready: Mapping[str, Readiness], idle: Mapping[str, float | None], *, floor: bool
) -> list[dict[str, Any]]:
    from bench._common import versions

    info = []
    if floor:
        info.append(
            {
                "server": FLOOR,
                "version": "canned answer on our front (bench._bare_server --native)",
                "batching": "none (no model: the client's and the front's limit)",
                "available": True,
                "reason": None,
                "installed": {},
                "idle_cpu_percent": idle.get(FLOOR),
            }
        )
    for name, state in ready.items():
        peer = PEERS[name]
        info.append(
            {
                "server": name,
                "version": state.installed.get("versions", {}).get(peer.dist, "-"),
                "batching": peer.batching,
                "available": state.python is not None,
                "reason": state.reason,
                "installed": state.installed,
                "idle_cpu_percent": idle.get(name),
            }
        )
    ours = versions("reactantserver-worker", "jax")
    info.append(
        {
            "server": OURS,
            "version": f"{ours['reactantserver-worker']} (jax {ours['jax']})",
            "batching": "default configuration (no queue delay; compiled 1, 2, 4, 8, 16, 32)",
            "available": True,
            "reason": None,
            "installed": {},
            "idle_cpu_percent": idle.get(OURS),
        }
    )
    return info


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--prepare", action="store_true", help="make the peers' venvs, then exit")
    parser.add_argument("--peers", nargs="*", choices=list(PEERS), default=list(PEERS))
    parser.add_argument("--venvs", type=Path, default=PEERS_DIR, help="the peers' venvs")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--duration", type=float, help="measured seconds per window")
    parser.add_argument("--warmup", type=float, help="seconds before each window")
    parser.add_argument("--rounds", type=int, help="sweeps over every cell and server")
    parser.add_argument("--raw-seconds", type=float, help="timed seconds per raw point")
    parser.add_argument("--idle", type=float, help="seconds to read the idle servers' CPU")
    parser.add_argument("--client", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--worker-env", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--no-pin", action="store_true", help="no CPU affinity")
    parser.add_argument("--no-floor", action="store_true", help="leave out the canned floor")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.3 s windows")
    parser.add_argument("--suite", action="store_true", help="`nox -s bench` size (~3 min)")
    return parser


def _sized(args: argparse.Namespace) -> argparse.Namespace:
    size = SIZES["quick" if args.quick else "suite" if args.suite else "full"]
    keys = ("duration", "warmup", "rounds", "raw_seconds", "idle")
    for key, value in zip(keys, size, strict=True):
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _prepare(names: Sequence[str], root: Path) -> int:
    failed = 0
    for name in names:
        print(f"== preparing {name} (pip, network)", flush=True)
        state = prepare(PEERS[name], root)
        if state.python is None:
            failed += 1
            print(f"{name}: {state.reason}", flush=True)
            continue
        i = state.installed
        print(
            f"{name}: {i['versions']} in {i['prepare_s']:.0f} s, {i['disk_bytes'] / 1e9:.2f} GB",
            flush=True,
        )
    return 1 if failed else 0


def _measure(
    args: argparse.Namespace, servers: dict[str, Server], cpus: frozenset[int] | None, tmp: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every round: the raw caps, then every cell with every server in turn, ours last."""
    assert OURS in servers
    counts: dict[tuple[str, str], Counts] = {}
    for name, server in servers.items():
        for model in args.models:
            if name == OURS:
                counts[name, model] = _our_counts(server, model)
            elif name == FLOOR:
                counts[name, model] = lambda: None  # it runs no model
            else:
                counts[name, model] = Counter.open(counter_path(tmp, name, model)).read
    windows, raw = [], []
    peers = [name for name in servers if name not in (OURS, FLOOR)]
    floor = [FLOOR] if FLOOR in servers else []
    for round_ in range(args.rounds):
        raw.append(_raw(args, cpus))
        # The peers' order flips every other round (drift falls on each alike); the floor is
        # first, ours last.
        order = [*floor, *(reversed(peers) if round_ % 2 else peers), OURS]
        for model in args.models:
            for c in args.concurrency:
                for name in order:
                    server = servers[name]
                    counted = counts[name, model]
                    row = _window(args, name, server, counts=counted, model=model, c=c)
                    windows.append({**row, "round": round_})
    return windows, raw


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or ``--prepare`` the venvs) and write JSON + Markdown under --out."""
    args = _sized(_parser().parse_args(argv))
    if args.prepare:
        return _prepare(args.peers, args.venvs)
    ready = {name: check(PEERS[name], args.venvs) for name in args.peers}
    for name, state in ready.items():
        if state.python is None:
            print(f"{name}: unavailable: {state.reason}", flush=True)
    description = machine("jax", "jaxlib", "grpcio", "tritonclient")  # the start's load average
    split = None if args.no_pin else cpu_split()
    client_cpus, server_cpus = split or (None, None)
    extra_env = dict(item.split("=", 1) for item in args.worker_env)
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="rs-bench-peers-") as name:
        tmp = Path(name)
        try:
            subprocess.run(
                [sys.executable, "-m", "bench._peers.export", "--out", str(tmp / "models")],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            start = time.perf_counter()
            if not args.no_floor:
                (tmp / FLOOR).mkdir()
                servers[FLOOR] = start_bare(tmp / FLOOR, server_cpus, native=True)
            servers.update(_start_peers(args, ready, tmp, server_cpus))
            (tmp / OURS).mkdir()
            servers[OURS] = start_worker(tmp / OURS, tmp / "models", extra_env, server_cpus)
            if client_cpus is not None:
                os.sched_setaffinity(0, client_cpus)  # before any client thread exists
            _wait(args, servers, ready)
            ready_after = time.perf_counter() - start
            idle = _idle_cpu(servers, args.idle)
            floor_ran = FLOOR in servers
            windows, raw = _measure(args, servers, server_cpus, tmp)
        finally:
            exits = {n: s.stop() for n, s in servers.items()}
    table = numbers.servers_table(windows)
    caps = numbers.raw_caps(raw)
    cell_rows = numbers.cells(table, caps, ours=OURS, floor=FLOOR)
    report: dict[str, Any] = {
        "machine": description,
        "command": " ".join([".venv/bin/python -m bench.peers", *(argv or sys.argv[1:])]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pinned": (
            {"client": sorted(client_cpus), "servers": sorted(server_cpus)}
            if client_cpus is not None and server_cpus is not None
            else None
        ),
        "loadavg_1m_end": loadavg(),
        "order": list(servers),
        "ready_after_s": ready_after,
        "servers": _servers_info(ready, idle, floor=floor_ran),
        "exit_status": exits,
        "windows": windows,
        "raw_rounds": raw,
        "raw_caps": {m: {str(b): v for b, v in p.items()} for m, p in caps.items()},
        "table": table,
        "cells": cell_rows,
        "errors": [
            f"{w['server']} {w['model']} c={w['concurrency']}: {w['first_error']}"
            for w in windows
            if w["first_error"]
        ],
    }
    report["figures"] = numbers.figures(cell_rows)
    write_report(args.out, RESULT_NAME, report, markdown(report))
    if windows:
        (args.out / "plots").mkdir(exist_ok=True)
        plot_peers({"peers": report}, args.out / "plots" / f"{RESULT_NAME}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
