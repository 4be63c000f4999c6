"""LogMux: prefixed, unbroken lines from real child pipes (09 §Log multiplexing)."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import threading

from reactantserver.node._logmux import MAX_LINE_BYTES, LogMux


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
