"""Fuzzing the readers: whatever happens to one durable file of a real session, ``check`` and
``resume`` end with a verdict or a typed refusal -- exit 0, 1 or 2 -- never a traceback.

Each example copies a real session (a finished run, or one whose control process was SIGKILLed
mid-run), damages one of its durable files -- truncates it at a random offset, flips bytes,
inserts a garbage line (random bytes, a random JSON value, or a real record with one field
replaced by a random JSON value), or deletes it -- and runs both commands in-process through
click's runner. The example counts are modest: a resume that gets past its refusals rebuilds
real shell processes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import Result
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tests.drills.conftest import copy_session, exarch_cli

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)

_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _durable_files(root: Path) -> list[str]:
    """Every durable file of the session (not scratch, not side files), sorted."""
    files = [p for p in root.iterdir() if p.is_file()]
    files += [p for p in (root / "agents").glob("*/*") if p.is_file()]
    return sorted(str(p.relative_to(root)) for p in files)


def _mutated(raw: bytes, data: st.DataObject) -> bytes:
    """``raw`` (one JSON document) with one field replaced by a random JSON value or dropped."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(doc, dict) or not doc:
        return raw
    key = data.draw(st.sampled_from(sorted(doc)), label="field")
    if data.draw(st.booleans(), label="drop field"):
        del doc[key]
    else:
        doc[key] = data.draw(_json, label="new value")
    return json.dumps(doc).encode()


def damage(root: Path, data: st.DataObject) -> str:
    """Damage one durable file of ``root``; returns what was done (for the failure report)."""
    rel = data.draw(st.sampled_from(_durable_files(root)), label="file")
    path = root / rel
    raw = path.read_bytes()
    how = data.draw(
        st.sampled_from(["truncate", "flip", "insert", "mutate", "delete"]), label="how"
    )
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw)), label="at")])
    elif how == "flip" and raw:
        buf = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            i = data.draw(st.integers(0, len(buf) - 1), label="offset")
            buf[i] ^= data.draw(st.integers(1, 255), label="mask")
        path.write_bytes(bytes(buf))
    elif how == "insert":
        lines = raw.splitlines(keepends=True)
        at = data.draw(st.integers(0, len(lines)), label="line")
        garbage = data.draw(
            st.one_of(
                st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b" ")),
                _json.map(lambda v: json.dumps(v).encode()),
            ),
            label="garbage",
        )
        path.write_bytes(b"".join([*lines[:at], garbage + b"\n", *lines[at:]]))
    elif how == "mutate":
        if rel.endswith(".jsonl"):
            lines = raw.splitlines(keepends=True)
            if lines:
                i = data.draw(st.integers(0, len(lines) - 1), label="record")
                lines[i] = _mutated(lines[i], data) + b"\n"
            path.write_bytes(b"".join(lines))
        else:
            path.write_bytes(_mutated(raw, data))
    note(f"damaged {rel}: {how}")
    event(f"{how} {Path(rel).name}")
    return f"{rel}: {how}"


def _check(root: Path) -> None:
    res = exarch_cli("check", str(root), "--json")
    assert res.exit_code in (0, 1), res.output  # one damaged file never makes it no session
    json.loads(res.output)


def _resume(root: Path) -> Result:
    res = exarch_cli("resume", str(root))
    assert res.exit_code in (0, 1, 2), res.output
    note(f"resume exit {res.exit_code}: {res.output[-300:]}")
    event(f"resume exit {res.exit_code}")
    return res


def _damage_check_resume(session: Path, data: st.DataObject) -> None:
    """Damage a copy of ``session``; check it, resume it, and check what resume left."""
    with tempfile.TemporaryDirectory() as d:
        root = copy_session(session, Path(d))
        damage(root, data)
        _check(root)
        if _resume(root).exit_code != 2:
            _check(root)


@pytest.mark.slow
@pytest.mark.timeout(400)
@settings(_SETTINGS, max_examples=40)
@given(data=st.data())
def test_check_and_resume_of_a_damaged_finished_session_never_traceback(
    finished_once: Path,
    data: st.DataObject,
) -> None:
    _damage_check_resume(finished_once, data)


@pytest.mark.slow
@pytest.mark.timeout(400)
@settings(_SETTINGS, max_examples=20)
@given(data=st.data())
def test_check_and_resume_of_a_damaged_crashed_session_never_traceback(
    crashed: Path, data: st.DataObject
) -> None:
    _damage_check_resume(crashed, data)


def test_the_fuzzed_session_has_every_kind_of_durable_file(crashed: Path) -> None:
    files = _durable_files(crashed)
    for name in ("transcript.jsonl", "spawn-journal.jsonl", "run.json"):
        assert name in files
    for agent in ("trunk", "slow", "quick"):
        assert f"agents/{agent}/events.jsonl" in files
        assert f"agents/{agent}/snapshot.msgpack" in files
    for agent in ("slow", "quick"):  # the children's ral calls committed
        assert f"agents/{agent}/commits.jsonl" in files
