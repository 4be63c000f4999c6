"""The status page asset and the document schema of ``reactantserver.core.status``."""

from __future__ import annotations

import html.parser
import re
import subprocess
import sys
import typing

from reactantserver.core import status


class _Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text of every ``<script>``."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def parsed() -> _Tags:
    tags = _Tags()
    tags.feed(status.page().decode("utf-8"))
    tags.close()
    return tags


def test_paths_and_refresh() -> None:
    assert (status.PAGE_PATH, status.STATUS_PATH) == ("/", "/status")
    assert not status.STATUS_PATH.startswith("/v2")
    assert status.PAGE_CONTENT_TYPE == "text/html; charset=utf-8"
    assert status.REFRESH_SECONDS == 2.0


def test_page_is_one_html_document_read_once() -> None:
    body = status.page()
    assert body is status.page()
    text = body.decode("utf-8")
    assert text.startswith("<!doctype html>")
    assert text.rstrip().endswith("</html>")
    assert '<meta charset="utf-8">' in text


def test_page_loads_nothing_from_elsewhere() -> None:
    tags = parsed()
    for tag, attrs in tags.tags:
        assert tag not in {"link", "img", "iframe", "object", "embed"}, tag
        assert "src" not in attrs, (tag, attrs)
        href = attrs.get("href")
        assert href is None or "//" not in href, (tag, href)
    text = status.page().decode()
    assert not re.search(r"@import|url\(", text)


def test_page_fetches_the_status_document_every_refresh() -> None:
    script = "".join(parsed().scripts)
    assert 'fetch("status"' in script
    assert f"REFRESH_MS = {int(status.REFRESH_SECONDS * 1000)}" in script


def test_page_never_parses_markup_from_data() -> None:
    # Model names and errors are user data: the script builds text nodes, never HTML strings.
    script = "".join(parsed().scripts)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_page_renders_every_document_field() -> None:
    script = "".join(parsed().scripts)
    for document in (
        status.WorkerStatus,
        status.DeviceStatus,
        status.ModelStatus,
        status.GatewayStatus,
        status.GatewayWorker,
        status.LastRepack,
        status.PlacementRow,
    ):
        for field in typing.get_type_hints(document):
            if field in {"kind", "status"}:
                continue
            assert re.search(rf"\.{field}\b", script), (document.__name__, field)


def test_schema_keys_follow_the_design() -> None:
    assert set(typing.get_type_hints(status.ModelStatus)) == {
        "name",
        "version",
        "state",
        "residency",
        "weight_bytes",
        "queue_depth",
        "requests",
        "failures",
        "executions",
        "device_time_share",
        "weight",
        "queue_wait_p50_seconds",
        "queue_wait_p99_seconds",
        "batch_sizes",
        "loads",
        "evictions",
    }
    assert typing.get_args(status.ResidencyName) == ("device", "host", "pinned")
    hints = typing.get_type_hints(status.GatewayWorker)
    assert hints["status"] == status.WorkerStatus | None


def test_import_needs_no_web_framework() -> None:
    code = (
        "import sys, reactantserver.core.status as s; s.page();"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'jax')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
