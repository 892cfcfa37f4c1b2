"""The status page as a user sees it: headless Chromium renders the pages of two real
``streamjoin worker`` processes on the real broker, and the rendered DOM must show both
members and every task with the owner and standby the group's real assignment gives it,
and charts with data points. A screenshot of each page is saved in the test's tmp dir.

Chromium is required (``apt-get install -y chromium``; ``scripts/bootstrap.sh`` installs
it with the test extra): without it the test fails, it is not skipped.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamjoin.runtime.group.group_info import GroupInfo, describe_group
from tests.integration.support import Workers, counter_workers, produce, wait_for_group

PARTITIONS = 4
#: the flags that let Chromium run as root on a machine with a closed network
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "Chromium is needed to check the status page as a browser renders it: install it with "
        "`apt-get install -y chromium` (scripts/bootstrap.sh does when the test extra is installed)"
    )


def render(url: str, profile: Path, *args: str) -> str:
    """What Chromium prints for ``url`` with ``args`` (``--dump-dom``: the rendered DOM)."""
    done = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Placement(HTMLParser):
    """The grid's cells (task, member, role), its member rows and the charts' point counts,
    read from the DOM as Chromium rendered it."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}
        self.rows: list[str] = []
        self.points: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "td" and "data-role" in found:
            self.cells[(found["data-task"], found["data-member"])] = found["data-role"]
        elif tag == "th" and "data-member" in found:
            self.rows.append(found["data-member"])
        elif tag == "svg" and "data-points" in found:
            self.points[found["id"]] = int(found["data-points"])


def expected_cells(info: GroupInfo, source: str, changelog: str) -> dict[tuple[str, str], str]:
    """The grid the group's real assignment should give: every member x every task."""
    cells = {}
    for m in info.members:
        for p in range(PARTITIONS):
            role = ""
            if p in m.active.get(source, []):
                role = "active"
            elif p in m.standby.get(changelog, []):
                role = "standby"
            elif p in m.warmup.get(changelog, []):
                role = "warmup"
            cells[(f"{source}#{p}", m.member_id)] = role
    return cells


@pytest.fixture
def workers(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    group = counter_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS)
    group.env.update(SJT_STANDBYS="1", SJT_STATUS_LOG_S="1")
    yield group
    group.close()


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as response:
        assert response.status == 200
        found: dict[str, Any] = await response.json()
        return found


async def test_chromium_sees_the_whole_group_and_charts_on_each_workers_page(
    kafka_bootstrap: str, workers: Workers, tmp_path: Path
) -> None:
    chromium()  # fail first, not after starting the workers
    source, app_id = workers.env["SJT_SOURCE"], workers.env["SJT_APP_ID"]
    for name in ("a", "b"):
        workers.start(name, extra=["--metrics-port", "0"])
    urls: dict[str, str] = {}
    deadline = time.monotonic() + 40
    while len(urls) < 2 and time.monotonic() < deadline:
        for name in ("a", "b"):
            found = re.search(r"status page and metrics on (http://\S+/)", workers.log_of(name))
            if found:
                urls[name] = found.group(1)
        await asyncio.sleep(0.2)
    assert len(urls) == 2, workers.logs()
    await produce(kafka_bootstrap, source, [(f"k{i}", str(i)) for i in range(40)])

    def settled(info: GroupInfo) -> bool:
        epochs = {m.generation for m in info.members}
        actives = sorted(p for m in info.members for p in m.active.get(source, []))
        standbys = [p for m in info.members for ps in m.standby.values() for p in ps]
        return (
            len(info.members) == 2
            and len(epochs) == 1
            and actives == list(range(PARTITIONS))
            and len(standbys) == PARTITIONS
            and all(m.active.get(source) for m in info.members)
        )

    info = await wait_for_group(kafka_bootstrap, app_id, settled, workers, timeout=40)
    changelog = next(t for m in info.members for t in m.standby)
    expected = expected_cells(info, source, changelog)
    epoch = info.members[0].generation

    async with aiohttp.ClientSession() as session:
        # each page must show this epoch and three samples at least (one a second)
        async def caught_up(url: str) -> bool:
            status = await get_json(session, url + "status.json")
            group = status.get("group") or {}
            return group.get("generation") == epoch and len(status["history"]) >= 3

        while not all([await caught_up(url) for url in urls.values()]):
            assert time.monotonic() < deadline + 20, workers.logs()
            await asyncio.sleep(0.3)

    for name, url in sorted(urls.items()):
        dom = render(url, tmp_path / f"profile-{name}", "--dump-dom")
        page = Placement()
        page.feed(dom)
        assert sorted(page.rows) == sorted(m.member_id for m in info.members), dom[-3000:]
        assert page.cells == expected, (name, page.cells, expected)
        assert page.points["chart-in"] >= 3 and page.points["chart-lag"] >= 3, page.points
        shot = tmp_path / f"status-{name}.png"
        render(url, tmp_path / f"profile-{name}", f"--screenshot={shot}", "--window-size=1280,1500")
        assert shot.stat().st_size > 10_000
    # the assignment did not change while the pages were rendered
    after = await describe_group(kafka_bootstrap, app_id)
    assert {m.member_id: (m.generation, m.active, m.standby) for m in after.members} == {
        m.member_id: (m.generation, m.active, m.standby) for m in info.members
    }
