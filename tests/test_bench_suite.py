"""``python -m bench.suite --quick`` over two real benchmarks: the combined report, the summary,
the plots, and the docs block written from it.

Only shapes are checked: benchmark figures are never asserted in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from bench._suite_plots import PLOTS, draw_all, plot_cold_loads
from bench._suite_report import DOCS_BEGIN, DOCS_END, figure_rows, summary, update_docs
from bench._suite_run import Benchmark, run_benchmark
from bench.suite import BENCHMARKS, _parser
from tests._bench_support import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: The two fastest real benchmarks (a few seconds each in --quick).
FAST = ("runtime", "rest")


@attrs.frozen
class SuiteRun:
    """One finished quick suite run: its output folder, exit status and combined report."""

    out: Path
    returncode: int
    output: str
    combined: dict[str, Any]

    @property
    def stem(self) -> str:
        """``<date>-<machine>``, the name of the report files."""
        return f"{self.combined['date']}-{self.combined['machine']['slug']}"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    out = tmp_path_factory.mktemp("suite")
    argv = ["--quick", "--only", *FAST, "--out", str(out), "--date", "2000-01-02"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.suite", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    [result] = out.glob("2000-01-02-*.json")
    return SuiteRun(out, done.returncode, done.stdout + done.stderr, json.loads(result.read_text()))


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_quick_suite_writes_the_combined_report(suite_run: SuiteRun) -> None:
    assert suite_run.returncode == 0, suite_run.output
    combined = suite_run.combined
    assert combined["mode"] == "quick"
    assert combined["machine"]["cpus"] >= 1
    assert suite_run.stem.endswith(combined["machine"]["slug"])
    assert list(combined["benchmarks"]) == list(FAST)
    for name, outcome in combined["benchmarks"].items():
        assert outcome["status"] == "ok", outcome["log_tail"]
        assert outcome["returncode"] == 0
        assert 0 < outcome["wall_s"] <= outcome["budget_s"]
        assert outcome["report"]["machine"]["slug"] == combined["machine"]["slug"], name
        assert outcome["report"]["figures"]
    # The runtime report feeds the cold-loads plot; the others lack data and say so.
    assert [p["file"] for p in combined["plots"]] == ["cold_loads.png"]
    assert len(combined["plot_notes"]) == len(PLOTS) - 1
    assert all("skipped, data missing" in note for note in combined["plot_notes"])
    plot_dir = suite_run.out / combined["plot_dir"]
    assert _is_png(plot_dir / "cold_loads.png")


@pytest.mark.slow
def test_quick_suite_writes_the_summary(suite_run: SuiteRun) -> None:
    markdown = (suite_run.out / f"{suite_run.stem}.md").read_text()
    assert markdown.startswith("# Benchmark suite, 2000-01-02")
    for fig in suite_run.combined["benchmarks"]["runtime"]["report"]["figures"]:
        assert f"| runtime | {fig['name']} |" in markdown
    assert "| rest | ok |" in markdown
    assert f"]({suite_run.combined['plot_dir']}/cold_loads.png)" in markdown


@pytest.mark.slow
def test_summary_and_figure_rows_mark_targets(suite_run: SuiteRun) -> None:
    benchmarks = dict(suite_run.combined["benchmarks"])
    rows = figure_rows(benchmarks)
    figures = [f for o in benchmarks.values() for f in o["report"]["figures"]]
    assert len(rows) == 2 + len(figures)
    verdicts = [row.rsplit("|", 2)[1].strip() for row in rows[2:]]
    assert verdicts == [{True: "met", False: "**not met**", None: "-"}[f["met"]] for f in figures]
    # A benchmark that did not run is one row saying why.
    benchmarks["rest"] = {**benchmarks["rest"], "status": "timeout", "note": "stopped after 1 s"}
    lines = summary({**suite_run.combined, "benchmarks": benchmarks})
    assert "| rest | (timeout: stopped after 1 s) | - | - | - | - |" in lines
    assert any(line.endswith("Not ok: rest.") for line in lines)


@pytest.mark.slow
def test_plots_draw_from_real_reports(suite_run: SuiteRun, tmp_path: Path) -> None:
    reports = {n: o["report"] for n, o in suite_run.combined["benchmarks"].items()}
    caption = plot_cold_loads(reports, tmp_path / "cold.png")
    assert caption
    assert _is_png(tmp_path / "cold.png")
    drawn, notes = draw_all({}, tmp_path / "none")
    assert drawn == []
    assert len(notes) == len(PLOTS)
    assert not list((tmp_path / "none").iterdir())


@pytest.mark.slow
def test_update_docs_writes_the_latest_figures(suite_run: SuiteRun, tmp_path: Path) -> None:
    docs = tmp_path / "docs" / "performance.md"
    docs.parent.mkdir()
    docs.write_text(f"# Performance\n\nintro\n\n{DOCS_BEGIN}\nOLD BLOCK\n{DOCS_END}\n\nreading\n")
    assert update_docs(docs, suite_run.out) == suite_run.out / f"{suite_run.stem}.json"
    text = docs.read_text()
    assert text.startswith("# Performance\n\nintro\n\n" + DOCS_BEGIN)
    assert text.endswith(DOCS_END + "\n\nreading\n")
    assert "OLD BLOCK" not in text
    assert "| runtime | start-up with cache hits / cold compile |" in text
    # Links are relative to the doc's folder.
    plot = suite_run.out / suite_run.combined["plot_dir"] / "cold_loads.png"
    link = text.split("cold_loads.png)")[0].rsplit("(", 1)[1] + "cold_loads.png"
    assert (docs.parent / link).resolve() == plot.resolve()


def test_missing_benchmark_is_reported(tmp_path: Path) -> None:
    outcome = run_benchmark(Benchmark("no_such_bench", 10, "-"), tmp_path, quick=True, limit_s=5)
    assert (outcome.status, outcome.report) == ("missing", None)


@pytest.mark.slow
def test_benchmark_over_its_budget_is_stopped(tmp_path: Path) -> None:
    runtime = next(b for b in BENCHMARKS if b.name == "runtime")
    outcome = run_benchmark(runtime, tmp_path, quick=False, limit_s=1)
    assert outcome.status == "timeout"
    assert outcome.returncode is None
    assert outcome.wall_s < 60


def test_only_takes_names_with_spaces_or_commas() -> None:
    parser = _parser()
    args = parser.parse_args(["--only", "density,gateway", "rest", "--skip", "rest"])
    assert args.only == [["density", "gateway"], ["rest"]]
    assert args.skip == [["rest"]]
    with pytest.raises(SystemExit):
        parser.parse_args(["--only", "density,nonesuch"])
