"""LogMux: prefixed, unbroken lines from real child pipes."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading

from reactantserver.node._logmux import (
    MAX_LINE_BYTES,
    NODE_LOGGER,
    SUPERVISOR_NAME,
    LogMux,
    json_line,
)


async def _pump_program(program: str, name: str = "child") -> bytes:
    """Run ``python -c program`` and pump its stdout and stderr through one LogMux."""
    out = io.BytesIO()
    mux = LogMux(out)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        program,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    await asyncio.gather(mux.pump(name, proc.stdout), mux.pump(name, proc.stderr))
    assert await proc.wait() == 0
    return out.getvalue()


def test_stdout_and_stderr_lines_are_prefixed() -> None:
    program = (
        "import sys\n"
        "print('hello', flush=True)\n"
        "print('oops', file=sys.stderr, flush=True)\n"
        "print('bye')\n"
    )
    lines = asyncio.run(_pump_program(program, "worker0")).splitlines()
    assert sorted(lines) == [b"[worker0] bye", b"[worker0] hello", b"[worker0] oops"]


def test_a_final_partial_line_is_emitted_at_eof() -> None:
    program = "import sys; sys.stdout.write('one\\ntwo without newline')"
    assert asyncio.run(_pump_program(program)) == b"[child] one\n[child] two without newline\n"


def test_a_line_longer_than_the_stream_limit_survives_whole() -> None:
    program = "import sys; sys.stdout.write('x' * 300_000 + '\\nafter\\n')"
    lines = asyncio.run(_pump_program(program)).splitlines()
    assert lines == [b"[child] " + b"x" * 300_000, b"[child] after"]


def test_a_runaway_line_is_emitted_in_bounded_pieces() -> None:
    size = 2 * MAX_LINE_BYTES + 10
    program = f"import sys; sys.stdout.write('y' * {size})"
    lines = asyncio.run(_pump_program(program)).splitlines()
    assert len(lines) >= 3
    assert all(line.startswith(b"[child] ") for line in lines)
    assert sum(len(line) - len(b"[child] ") for line in lines) == size
    assert max(len(line) for line in lines) < MAX_LINE_BYTES + (1 << 17)


def test_undecodable_bytes_pass_through() -> None:
    program = "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\x00junk\\x80\\n\\xc3')"
    assert asyncio.run(_pump_program(program)) == b"[child] \xff\xfe\x00junk\x80\n[child] \xc3\n"


def test_supervisor_lines_and_crlf() -> None:
    out = io.BytesIO()
    mux = LogMux(out)
    mux.supervisor("starting é")
    mux.write_line("w", b"windows\r\n")
    assert out.getvalue() == "[supervisor] starting é\n".encode() + b"[w] windows\n"


def test_concurrent_writers_never_interleave() -> None:
    out = io.BytesIO()
    mux = LogMux(out)

    def write(name: str) -> None:
        for i in range(500):
            mux.write_line(name, f"{name} line {i} ".encode() * 20)

    threads = [threading.Thread(target=write, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2000
    for line in lines:
        name = line[1:3].decode()
        assert line.startswith(f"[{name}] {name} line ".encode())
        assert line.count(name.encode()) == 21


def test_a_closed_output_does_not_raise() -> None:
    out = io.BytesIO()
    mux = LogMux(out)
    out.close()
    mux.supervisor("nobody listens")


def _json_records(program: str, name: str) -> list[dict[str, object]]:
    out = io.BytesIO()
    mux = LogMux(out, json_lines=True)

    async def pump() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            program,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        await asyncio.gather(mux.pump(name, proc.stdout), mux.pump(name, proc.stderr))
        assert await proc.wait() == 0

    asyncio.run(pump())
    mux.supervisor("all children exited")
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_logs_stay_json_lines_with_the_process_as_a_field() -> None:
    program = (
        "import json, sys\n"
        "print(json.dumps({'ts': 't', 'level': 'WARNING', 'logger': 'reactantserver.worker',"
        " 'msg': 'request failed', 'model': 'mlp'}), file=sys.stderr, flush=True)\n"
        "print('Traceback (most recent call last): \\u00e9', flush=True)\n"
    )
    records = _json_records(program, "worker0")
    assert len(records) == 3
    child_record = next(r for r in records if r.get("logger") == "reactantserver.worker")
    assert child_record == {
        "ts": "t",
        "level": "WARNING",
        "logger": "reactantserver.worker",
        "msg": "request failed",
        "model": "mlp",
        "process": "worker0",
    }
    stray = next(r for r in records if str(r.get("msg", "")).startswith("Traceback"))
    assert stray["process"] == "worker0"
    assert stray["logger"] == NODE_LOGGER
    assert stray["msg"] == "Traceback (most recent call last): \u00e9"
    assert {"ts", "level"} <= stray.keys()
    own = records[-1]
    assert own["process"] == SUPERVISOR_NAME
    assert own["msg"] == "all children exited"


def test_json_line_keeps_a_childs_own_process_field_and_wraps_non_objects() -> None:
    kept = json.loads(json_line("worker1", b'{"msg": "x", "process": "gateway"}'))
    assert kept == {"msg": "x", "process": "gateway"}
    wrapped = json.loads(json_line("worker1", b"[1, 2]"))
    assert wrapped["msg"] == "[1, 2]"
    assert wrapped["process"] == "worker1"
