"""The snapshot and the ledger's reach rule with real ral values made by a real Session."""

from __future__ import annotations

from pathlib import Path

import pytest

codec = pytest.importorskip("exarch_actors.runtime.ral.codec")
session_mod = pytest.importorskip("exarch_actors.runtime.ral.session")

from exarch_actors.runtime.ral.context import DynamicContext  # noqa: E402
from exarch_actors.runtime.ral.values import Closure, Variant, WorkerHandle  # noqa: E402
from exarch_actors.runtime.shell.ledger import reaches_running_worker  # noqa: E402
from exarch_actors.runtime.state.snapshot import MobileSnapshot  # noqa: E402


def fresh_session() -> object:
    return session_mod.Session(context=DynamicContext(cwd="/", env={}), faults=False)


def test_closures_and_variants_survive_a_snapshot_and_work_after_restore(tmp_path: Path) -> None:
    s = fresh_session()
    res = s.run('let big = "kept"; let f = { echo $big }; let v = variant ok [1, 2]')  # type: ignore[attr-defined]
    assert res.error is None, res.error
    snap = MobileSnapshot(  # as the shell keeps them: each binding as its encode_value bytes
        agent="a",
        epoch=1,
        bindings={n: codec.encode_value(v) for n, v in s.bindings().items()},  # type: ignore[attr-defined]
        context=s.context.to_dict(),  # type: ignore[attr-defined]
        ledger={},
        workers={},
    )
    path = tmp_path / "snapshot.msgpack"
    snap.write_atomic(path)
    loaded = MobileSnapshot.load(path)
    values = loaded.decoded_bindings()
    assert isinstance(values["f"], Closure)
    assert values["v"] == Variant("ok", [1, 2])
    back = fresh_session()
    back.restore(values, DynamicContext.from_dict(dict(loaded.context)))  # type: ignore[attr-defined]
    back.unset("big")  # type: ignore[attr-defined]  # the capture scenario: f keeps working
    assert back.run("f").stdout == "kept\n"  # type: ignore[attr-defined]


def test_a_real_closure_capturing_a_running_handle_does_not_pin() -> None:
    s = fresh_session()
    s.restore({"h": WorkerHandle("w1")}, DynamicContext(cwd="/", env={}))  # type: ignore[attr-defined]
    assert s.run("let f = { $h }; let xs = [$h]").error is None  # type: ignore[attr-defined]
    running = lambda h: True  # noqa: E731
    assert not reaches_running_worker(s.get("f"), running)  # type: ignore[attr-defined]
    assert reaches_running_worker(s.get("xs"), running)  # type: ignore[attr-defined]
