"""The /resources resource_rows (runtime.fleet.probes): pure rows and a card."""

from __future__ import annotations

import copy

from exarch_actors.runtime.fleet.probes import (
    ResourceFigures,
    event_rows,
    render_card,
    resource_rows,
    resources,
)
from exarch_actors.runtime.shell.ledger import LedgerFigures
from exarch_actors.runtime.shell.worker_retention import WorkerFigures


def figures() -> ResourceFigures:
    return ResourceFigures(
        workers={
            "running": 2,
            "settled": 1,
            "nearest_reap_calls": 17,
            "nearest_backstop_secs": 3.5,
        },
        ledger={
            "armed": True,
            "live": 4,
            "baseline": 9,
            "pinned": 0,
            "nearest_expiry_calls": 200,
            "bytes_held": 2048,
        },
        inbox_depths={"user": 0, "agent_result": 3},
        event_count=12,
        history_bytes=4096,
        disk={"log dir": 1024, "scratch": 512},
        disk_ceiling=1 << 30,
        lease_nearest_reap_secs=42.0,
        lease_demote_secs=600.0,
    )


def test_every_figure_becomes_a_row() -> None:
    rows = {r.name: r for r in resource_rows(figures())}
    assert rows["workers.running"].value == 2
    assert rows["workers.nearest_reap_calls"].detail == "in 17 ral calls"
    assert rows["bindings.live"].value == 4 and "armed" in rows["bindings.live"].detail
    assert rows["bindings.bytes"].detail == "2.0 KiB"
    assert rows["inbox.agent_result"].value == 3 and rows["inbox.total"].value == 3
    assert rows["eventlog.events"].value == 12 and rows["eventlog.bytes"].value == 4096
    assert rows["disk.log_dir"].value == 1024 and rows["disk.total"].value == 1536
    assert "ceiling 1.0 GiB" in rows["disk.total"].detail
    assert rows["lease.nearest_reap_secs"].value == 42.0
    assert rows["lease.demote_secs"].value == 600.0


def test_the_real_probe_dataclasses_fold_like_their_dicts() -> None:
    f = figures()
    typed = ResourceFigures(
        workers=WorkerFigures(**f.workers),  # type: ignore[arg-type]
        ledger=LedgerFigures(**f.ledger),  # type: ignore[arg-type]
        inbox_depths=f.inbox_depths,
        event_count=f.event_count,
        history_bytes=f.history_bytes,
        disk=f.disk,
        disk_ceiling=f.disk_ceiling,
        lease_nearest_reap_secs=f.lease_nearest_reap_secs,
        lease_demote_secs=f.lease_demote_secs,
    )
    assert resource_rows(typed) == resource_rows(f)


def test_an_unavailable_probe_is_a_visible_row_not_a_missing_one() -> None:
    rows = {r.name: r for r in resource_rows(ResourceFigures(disk={"scratch": None}))}
    assert rows["workers"].value is None and rows["workers"].detail == "probe unavailable"
    assert rows["bindings"].value is None
    assert rows["disk.total"].value is None
    assert rows["lease.nearest_reap_secs"].detail == "-"


def test_the_fold_mutates_nothing_it_reads() -> None:
    f = figures()
    before = copy.deepcopy(f)
    resource_rows(f)
    assert f == before


def test_the_card_is_an_aligned_plain_text_table() -> None:
    rows, card = resources(figures(), title="resources of trunk")
    lines = card.splitlines()
    assert lines[0] == "resources of trunk"
    assert len(lines) == len(rows) + 1
    starts = {line.index(r.name) for line, r in zip(lines[1:], rows)}
    assert starts == {2}
    assert render_card(rows, "resources of trunk") == card


def test_event_rows_carry_the_raw_values() -> None:
    pairs = dict(event_rows(resource_rows(figures())))
    assert pairs["eventlog.bytes"] == 4096
