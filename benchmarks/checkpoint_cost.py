"""Checkpoint cost with 10, 1,000 and 100,000 session bindings when one binding changed.

Stages, each the median of several repetitions after one binding was rebound:

- ``encode``   re-encode what changed and re-join the pre-packed bindings section
               (BindingEncodingCache.put + packed_section): the incremental part.
- ``sync``     the same, found by an identity scan of the whole scope (cache.sync) instead of
               the define hook: what a host pays if it does not feed the cache incrementally.
- ``snapshot`` SnapshotBuilder.checkpoint (incremental encode + the name->bytes map copy).
- ``ledger``   BindingLedger.to_state with every binding leased (it rides in the same file).
- ``bytes``    MobileSnapshot.encode: the whole file's bytes (body join + CRC + envelope).
- ``write``    write_atomic: bytes + temp write + fsync + rename + fsync(dir).
- ``cold``     encoding every value from scratch (what a cache-less checkpoint would pay).

Run: ``PYTHONPATH=. python benchmarks/checkpoint_cost.py``. Uses ``runtime.ral.codec`` when it
exists, else plain msgpack for the values (the per-value encoder is not what is measured here:
the point is how many values get encoded).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from runtime.shell.ledger import BindingLedger
from runtime.state.snapshot import BindingEncodingCache, MobileSnapshot, SnapshotBuilder

SIZES = (10, 1_000, 100_000)
REPS = 7


def _encoder() -> tuple[Callable[[Any], bytes], str]:
    try:
        from runtime.ral.codec import encode_value

        return encode_value, "runtime.ral.codec.encode_value"
    except ImportError:
        return (lambda v: msgpack.packb(v, use_bin_type=True)), "msgpack.packb (codec absent)"


def _median_ms(fn: Callable[[], object], reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _value(i: int) -> Any:
    return [f"line {i} of some scratch output", i, {"k": i}] if i % 3 == 0 else f"value-{i:08d}"


def measure(n: int, encode: Callable[[Any], bytes], tmp: Path) -> dict[str, float]:
    scope = {f"name_{i}": _value(i) for i in range(n)}
    builder = SnapshotBuilder("bench", encode=encode)
    ledger = BindingLedger()
    ledger.arm([])
    for i, name in enumerate(scope):
        builder.cache.put(name, scope[name])
        ledger.note_define(name, 1, 32 + i % 7)
    context = {"cwd": "/tmp", "env": {"HOME": "/root"}, "grants": {"exec": None, "roots": None}}

    t0 = time.perf_counter()
    BindingEncodingCache(encode).sync(scope)
    cold_cache = BindingEncodingCache(encode)
    cold_cache.sync(scope)
    cold_cache.packed_section()
    cold = (time.perf_counter() - t0) * 1000
    builder.checkpoint(epoch=1, context=context, ledger={}, workers={})

    counter = iter(range(10**9))

    def change() -> None:
        scope["name_0"] = f"changed {next(counter)}"

    def incremental() -> None:
        change()
        builder.cache.put("name_0", scope["name_0"])
        builder.cache.packed_section()

    def by_sync() -> None:
        change()
        builder.cache.sync(scope)
        builder.cache.packed_section()

    def snapshot() -> None:
        change()
        builder.cache.put("name_0", scope["name_0"])
        builder.checkpoint(epoch=2, context=context, ledger={}, workers={})

    before = builder.cache.encode_calls
    enc = _median_ms(incremental)
    assert builder.cache.encode_calls - before == REPS, "an unchanged binding was re-encoded"
    syn = _median_ms(by_sync)
    snap_ms = _median_ms(snapshot)
    led = _median_ms(ledger.to_state)
    change()
    builder.cache.put("name_0", scope["name_0"])
    snap = builder.checkpoint(epoch=3, context=context, ledger=ledger.to_state(), workers={})
    byt = _median_ms(snap.encode)
    path = tmp / f"snap-{n}.msgpack"
    wr = _median_ms(lambda: snap.write_atomic(path))
    size = path.stat().st_size
    assert MobileSnapshot.load(path).bindings["name_0"] == snap.bindings["name_0"]
    return {
        "n": n,
        "encode": enc,
        "sync": syn,
        "snapshot": snap_ms,
        "ledger": led,
        "bytes": byt,
        "write": wr,
        "cold": cold / 2,
        "file_kib": size / 1024,
    }


def main() -> int:
    encode, label = _encoder()
    print(f"value encoder: {label}; median of {REPS} checkpoints after one binding changed (ms)")
    cols = ("encode", "sync", "snapshot", "ledger", "bytes", "write", "cold")
    print(f"{'bindings':>9} " + " ".join(f"{c:>9}" for c in cols) + f" {'file KiB':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in SIZES:
            row = measure(n, encode, Path(d))
            rows.append(row)
            print(
                f"{n:>9,} "
                + " ".join(f"{row[c]:>9.3f}" for c in cols)
                + f" {row['file_kib']:>9.0f}"
            )
    lo, hi = rows[0], rows[-1]
    print(f"ratio {hi['n']:,} / {lo['n']:,} bindings:")
    for c in cols:
        print(f"  {c:>9}: x{hi[c] / max(lo[c], 1e-6):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
