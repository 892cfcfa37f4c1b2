"""The status page (``/``) rendered from a snapshot (pure: a dict in, HTML out).

Self-contained: no external scripts, styles or fonts, so it works on an isolated
network. It refreshes itself every few seconds; clicking a column header sorts
the table (the choice survives the refresh, in the page's URL fragment). It shows
the whole group (the snapshot's ``group``, see ``group_view.py``: members, and a grid
of members x tasks with each task's active owner, standbys and warm-ups) and charts
of the last minutes (the snapshot's ``history``, see ``history.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from streamjoin.runtime.ops.charts import line_chart

__all__ = ["render_status_page"]

REFRESH_SECONDS = 5

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em} h2{font-size:1.05em;margin:1.4em 0 .4em}
.meta{color:#555} .meta b{color:#222}
.cards{display:flex;flex-wrap:wrap;gap:.6em;margin:.8em 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.4em .8em}
.card .v{font-size:1.2em;font-weight:600}
table{border-collapse:collapse;background:#fff;min-width:40em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#eee;cursor:pointer;user-select:none} th:hover{background:#e0e0e0}
td.t,th.t{text-align:left}
tr.active td.role{color:#1a7f37} tr.restoring td.role,tr.warmup td.role{color:#9a6700}
tr.standby td.role,tr.pending td.role{color:#0550ae} tr.revoking td.role{color:#cf222e}
.empty{color:#777;font-style:italic} a{color:#0550ae}
table.grid{min-width:0} table.grid th{cursor:default}
table.grid td{text-align:center;min-width:1.6em}
table.grid th.g{text-align:center} table.grid th.moving{background:#ffd8d3;color:#cf222e}
table.grid td.active{background:#1a7f37;color:#fff;font-weight:600}
table.grid td.standby{background:#ddf4ff;color:#0550ae} table.grid td.warmup{background:#fff1c2}
table.grid td.incoming{background:#fff;color:#9a6700;outline:2px dashed #9a6700;outline-offset:-3px}
table.grid tr.left td{color:#999;background:#f3f3f3} td.self{font-weight:600}
.legend span{display:inline-block;padding:0 .4em;margin-right:.6em;border:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:.6em}
svg.chart{background:#fff;border:1px solid #ddd;border-radius:6px}
svg.chart .ct{font-size:12px;fill:#222} svg.chart .cv{font-size:13px;font-weight:600;fill:#222}
svg.chart .cl{font-size:10px;fill:#666} svg.chart .grid{stroke:#eee} svg.chart .axis{stroke:#999}
svg.chart .line{fill:none;stroke:#0550ae;stroke-width:1.6} svg.chart .pt{fill:#0550ae}
"""

#: a grid cell's letter for each role a member can hold a task in
_ROLE_MARK = {"active": "A", "standby": "S", "warmup": "W", "incoming": "\u2192A"}
#: marks a task no member holds as active right now (revoked, not yet assigned)
_MOVING = "\u21c4"

#: sorts a table by the clicked column (numbers as numbers); remembered in the URL fragment
_SCRIPT = """
function sortBy(table, col, desc) {
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  rows.sort(function (a, b) {
    var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
    var nx = parseFloat(x), ny = parseFloat(y), r;
    if (!isNaN(nx) && !isNaN(ny)) { r = nx - ny; } else { r = x < y ? -1 : x > y ? 1 : 0; }
    return desc ? -r : r;
  });
  rows.forEach(function (row) { body.appendChild(row); });
}
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var key = table.id + ':' + col, desc = location.hash === '#' + key;
      location.hash = desc ? key + ':desc' : key;
      sortBy(table, col, desc);
    });
  });
});
(function () {
  var m = /^#([\\w-]+):(\\d+)(:desc)?$/.exec(location.hash);
  var table = m && document.getElementById(m[1]);
  if (table) { sortBy(table, parseInt(m[2], 10), !!m[3]); }
})();
"""


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(
    table_id: str,
    columns: Sequence[tuple[str, str, bool]],
    rows: Sequence[Mapping[str, Any]],
    empty: str,
) -> str:
    """``columns``: (key, title, text?) in order; one ``<tr>`` per row, classed by role."""
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    head = "".join(
        f'<th class="t">{escape(title)}</th>' if text else f"<th>{escape(title)}</th>"
        for _, title, text in columns
    )
    body = []
    for row in rows:
        cells = []
        for key, _, text in columns:
            value = row.get(key)
            sort_value = "" if value is None else str(value)
            classes = " ".join(c for c in ("t" if text else "", key if key == "role" else "") if c)
            cls = f' class="{classes}"' if classes else ""
            cells.append(f'<td{cls} data-v="{escape(sort_value)}">{escape(_fmt(value))}</td>')
        role = escape(str(row.get("role", "")))
        body.append(f'<tr class="{role}">' + "".join(cells) + "</tr>")
    return (
        f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _card(title: str, value: str) -> str:
    return f'<div class="card"><div>{escape(title)}</div><div class="v">{escape(value)}</div></div>'


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _group_section(group: Mapping[str, Any] | None, scheme: str, now: float) -> list[str]:
    """The group's members, and the grid of members x tasks (who holds each task how)."""
    if not group:
        return ["<h2>Group</h2>", '<p class="empty">the group has not been described yet</p>']
    described = _ago(now - group["described_at"]) if group.get("described_at") else "never"
    meta = (
        f"state <b>{escape(str(group.get('state')))}</b> · "
        f"assignment epoch <b>{escape(_fmt(group.get('generation')))}</b> · "
        f"protocol {escape(str(group.get('protocol') or '-'))} · as the coordinator "
        f"described it {escape(described)}"
    )
    if group.get("error"):
        meta += f' · <span class="role">describing it again failed: {escape(group["error"])}</span>'
    members = list(group.get("members") or ())
    rows = []
    for m in members:
        host = m.get("host")
        link = f'<a href="{escape(scheme)}://{escape(host)}/">{escape(host)}</a>' if host else "-"
        alive = "yes" if m["alive"] else f"no (left {_ago(now - m['left_at'])})"
        rows.append(
            f'<tr class="{"member" if m["alive"] else "left"}">'
            f'<td class="t{" self" if m.get("self") else ""}">{escape(m["name"])}'
            f"{' (this worker)' if m.get('self') else ''}</td>"
            f'<td class="t">{escape(str(m.get("client_id") or "-"))}</td>'
            f'<td class="t">{link}</td><td class="t">{escape(alive)}</td>'
            f"<td>{m.get('active_tasks', 0)}</td><td>{m.get('standby_tasks', 0)}</td>"
            f"<td>{m.get('warmup_tasks', 0) + m.get('incoming_tasks', 0)}</td></tr>"
        )
    member_table = (
        '<table id="members"><thead><tr><th class="t">member</th><th class="t">client id</th>'
        '<th class="t">web endpoint</th><th class="t">alive</th><th>active tasks</th>'
        "<th>standby tasks</th><th>warm-ups</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">no members</p>'
    )
    tasks = list(group.get("tasks") or ())
    return [
        "<h2>Group</h2>",
        f'<div class="meta">{meta}</div>',
        member_table,
        "<h2>Task placement</h2>",
        _grid(members, tasks) if tasks else '<p class="empty">no tasks assigned</p>',
    ]


def _grid(members: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]]) -> str:
    """Members down, tasks across (grouped by co-partition group); a cell says the role."""
    groups: list[tuple[str, int]] = []
    for task in tasks:
        if groups and groups[-1][0] == task["group"]:
            groups[-1] = (task["group"], groups[-1][1] + 1)
        else:
            groups.append((task["group"], 1))
    head_groups = "".join(f'<th class="g" colspan="{n}">{escape(name)}</th>' for name, n in groups)
    head_parts = "".join(
        f'<th class="{"moving" if t["moving"] else "p"}" data-task="{escape(t["task"])}" '
        f'title="{escape(t["task"])}{" (moving: no active owner)" if t["moving"] else ""}">'
        f"{t['partition']}{' ' + _MOVING if t['moving'] else ''}</th>"
        for t in tasks
    )
    body = []
    for m in members:
        cells = []
        for t in tasks:
            role = next((r for r in _ROLE_MARK if m["id"] in t.get(r, ())), "")
            cells.append(
                f'<td class="{role}" data-task="{escape(t["task"])}" '
                f'data-member="{escape(m["id"])}" data-role="{role}">'
                f"{_ROLE_MARK.get(role, '')}</td>"
            )
        body.append(
            f'<tr class="{"member" if m["alive"] else "left"}">'
            f'<th class="t" data-member="{escape(m["id"])}">{escape(m["name"])}</th>'
            f"{''.join(cells)}</tr>"
        )
    return (
        f'<table class="grid" id="placement"><thead><tr><th class="t" rowspan="2">member</th>'
        f"{head_groups}</tr><tr>{head_parts}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        '<p class="meta legend"><span class="active" style="background:#1a7f37;color:#fff">A'
        '</span>active owner <span style="background:#ddf4ff">S</span>standby '
        '<span style="background:#fff1c2">W</span>warm-up (restoring to take over) '
        "<span>\u2192A</span>incoming (withheld until its owner revokes it) "
        '<span style="background:#ffd8d3">\u21c4</span>moving: no active owner now</p>'
    )


def _charts_section(history: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """The last minutes as four small charts."""
    charts = [
        ("chart-in", "records in", "records/s", "records_in_per_second"),
        ("chart-lag", "lag (committed)", "records", "lag"),
        ("chart-commit", "commit latency", "ms", "commit_latency_ms"),
        ("chart-restore", "restore: records left", "records", "restore_records_left"),
    ]
    return [
        "<h2>Last minutes</h2>",
        '<div class="charts">',
        *(
            line_chart(chart_id, title, unit, [(row["at"], row.get(key)) for row in history], now)
            for chart_id, title, unit, key in charts
        ),
        "</div>",
    ]


def render_status_page(snapshot: Mapping[str, Any], now: float | None = None) -> str:
    """The HTML status page of one worker's ``snapshot`` (see :func:`monitor.collect`)."""
    now = time.time() if now is None else now
    worker = snapshot.get("worker") or {}
    throughput = snapshot.get("throughput") or {}
    rebalance = snapshot.get("rebalance") or {}
    partitions = list(snapshot.get("partitions") or [])
    tables = list(snapshot.get("tables") or [])
    lags = [p["lag"] for p in partitions if p.get("lag") is not None]
    last = rebalance.get("last")
    if last:
        last_text = (
            f"generation {last['generation']} ({last['protocol']}), {_ago(now - last['at'])}, "
            f"took {last['seconds']:.2f} s: {last['assigned']} assigned, "
            f"{last['revoked']} revoked, {last['owned']} owned"
        )
    else:
        last_text = "none yet"
    if rebalance.get("in_progress"):
        last_text += "; a rebalance is in progress"
    errors = sum((snapshot.get("errors") or {}).values())
    cards = [
        _card("records in", _fmt(throughput.get("records_in"))),
        _card("in / s", _fmt(throughput.get("records_in_per_second"))),
        _card("records out", _fmt(throughput.get("records_out"))),
        _card("out / s", _fmt(throughput.get("records_out_per_second"))),
        _card("changelog records", _fmt(throughput.get("changelog_records"))),
        _card("lag (committed)", _fmt(sum(lags)) if lags else "-"),
        _card("commits", _fmt(snapshot.get("commits"))),
        _card("rebalances", _fmt(rebalance.get("rebalance-total"))),
        _card("errors", _fmt(errors)),
    ]
    failures = [
        {"what": what, "name": name, "count": n}
        for what, key in (
            ("error", "errors"),
            ("dead-lettered", "dead_lettered"),
            ("skipped", "skipped"),
        )
        for name, n in sorted((snapshot.get(key) or {}).items())
    ]
    joins = [
        {"join": name, **stats} for name, stats in sorted((snapshot.get("joins") or {}).items())
    ]
    title = f"streamjoin {worker.get('app_id', '')}"
    member = worker.get("member_id") or "(not in the group)"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        '<div class="meta">',
        f"worker <b>{escape(str(worker.get('client_id', '')))}</b> · "
        f"member <b>{escape(str(member))}</b> · "
        f"generation <b>{escape(_fmt(worker.get('generation')))}</b> · "
        f"up {escape(_ago(worker.get('uptime_seconds')).replace(' ago', ''))}<br>",
        f"last rebalance: {escape(last_text)}",
        "</div>",
        f'<div class="cards">{"".join(cards)}</div>',
        *_charts_section(list(snapshot.get("history") or ()), now),
        *_group_section(
            snapshot.get("group"), str(worker.get("web_url") or "http:").partition(":")[0], now
        ),
        "<h2>Source partitions (this worker)</h2>",
        _table(
            "sources",
            [
                ("topic", "topic", True),
                ("partition", "partition", False),
                ("role", "role", True),
                ("records_in", "records in", False),
                ("rate", "records/s", False),
                ("end_offset", "end offset", False),
                ("committed_offset", "committed", False),
                ("processed_offset", "processed", False),
                ("lag", "lag", False),
                ("lag_processed", "lag (processed)", False),
            ],
            partitions,
            "no source partitions assigned to this worker",
        ),
        "<h2>Table partitions (this worker)</h2>",
        _table(
            "tables",
            [
                ("table", "table", True),
                ("partition", "partition", False),
                ("role", "role", True),
                ("store", "store", True),
                ("lag", "lag", False),
                ("rate", "records/s (restore, standby)", False),
                ("records_left", "records left", False),
                ("eta_seconds", "ETA (s)", False),
            ],
            tables,
            "no table partitions held by this worker",
        ),
    ]
    if joins:
        parts += [
            "<h2>Joins</h2>",
            _table(
                "joins",
                [
                    ("join", "join", True),
                    ("emitted", "emitted", False),
                    ("late", "late (dropped)", False),
                    ("beyond_grace", "beyond grace", False),
                ],
                joins,
                "",
            ),
        ]
    timers = [{"timer": n, **row} for n, row in sorted((snapshot.get("timers") or {}).items())]
    if timers:
        parts += [
            "<h2>Timers and app tasks</h2>",
            _table(
                "timers",
                [
                    ("timer", "name", True),
                    ("schedule", "schedule", True),
                    ("on_leader", "leader only", True),
                    ("runs", "runs", False),
                    ("errors", "errors", False),
                    ("skipped_overrun", "ticks overrun", False),
                    ("skipped_not_leader", "ticks not leading", False),
                    ("last_duration_seconds", "last run (s)", False),
                    ("running", "running", True),
                ],
                timers,
                "",
            ),
        ]
    parts += [
        "<h2>Errors</h2>",
        _table(
            "errors",
            [("what", "what", True), ("name", "kind / agent", True), ("count", "count", False)],
            failures,
            "no errors",
        ),
        '<p class="meta">Refreshes every '
        f"{REFRESH_SECONDS} s · click a column to sort · "
        '<a href="status.json">status.json</a> · <a href="metrics">metrics</a></p>',
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)
