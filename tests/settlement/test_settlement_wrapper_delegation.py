"""Every executor surface — optional ones included — survives every wrapper, nested or not.

The surfaces are enumerated from the protocols themselves, so a surface added to the interface
later is covered here without editing this file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from exarch_actors.runtime.settlement.executor import (
    OPTIONAL_SURFACES,
    REQUIRED_SURFACES,
    Accounting,
    CancelAck,
    CompletionGate,
    DelegatingExecutor,
    EnvironmentState,
    Execution,
    ExecutionResult,
    ExecutionSpec,
    Executor,
    Grace,
    InFlight,
    Observation,
    OptionalSurfaces,
    Receipt,
    RetryPreSpawnRefusals,
    surface,
)
from exarch_actors.runtime.settlement.local_executor import LocalProcessExecutor


def _protocol_members(proto: type) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")}


ALL_SURFACES = sorted(_protocol_members(Executor) | _protocol_members(OptionalSurfaces))


class Recording:
    """Implements every surface; each returns a unique object and records the call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.exe = Execution("env-rec", "n", 1, "/nonexistent", None)
        self.res = ExecutionResult("done", 0)
        self.receipt = Receipt(True, "rec", "env-rec", EnvironmentState.DESTROYED)
        self.ack = CancelAck("accepted", "rec")
        self.acc = Accounting(1, 2, 0, 0.5)
        self.obs = Observation("running")
        self.inflight = InFlight(1, ({"k": "v"},), None)

    @property
    def environment_id(self) -> str:
        self.calls.append("environment_id")
        return "env-rec"

    def execute(self, spec: ExecutionSpec) -> Execution:
        self.calls.append("execute")
        return self.exe

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        self.calls.append("result")
        return self.res

    def teardown(self, grace: Grace) -> Receipt:
        self.calls.append("teardown")
        return self.receipt

    def release_retained(self) -> list[Receipt]:
        self.calls.append("release_retained")
        return [self.receipt]

    def recover(self) -> Execution | None:
        self.calls.append("recover")
        return self.exe

    def cancel(self) -> CancelAck:
        self.calls.append("cancel")
        return self.ack

    def accounting(self) -> Accounting:
        self.calls.append("accounting")
        return self.acc

    def observe(self) -> Observation:
        self.calls.append("observe")
        return self.obs

    def in_flight(self) -> InFlight:
        self.calls.append("in_flight")
        return self.inflight


class RequiredOnly:
    environment_id = "env-min"

    def execute(self, spec: ExecutionSpec) -> Execution:
        return Execution("env-min", "n", 1, "/nonexistent", None)

    def result(self, timeout: float | None = None) -> ExecutionResult | None:
        return ExecutionResult("done", 0)

    def teardown(self, grace: Grace) -> Receipt:
        return Receipt(True, "min", "env-min")


class OnlyOverridesTeardown(DelegatingExecutor):
    """A third-party wrapper written against the base: overrides one surface, forwards the rest."""

    def teardown(self, grace: Grace) -> Receipt:
        return self._inner.teardown(grace)


def _gate(x: Any) -> CompletionGate:
    return CompletionGate(x, lambda _r, _e: None)


WRAPPERS: dict[str, Callable[[Any], Any]] = {
    "retry": RetryPreSpawnRefusals,
    "gate": _gate,
    "third-party": OnlyOverridesTeardown,
    "retry(gate)": lambda x: RetryPreSpawnRefusals(_gate(x)),
    "gate(retry)": lambda x: _gate(RetryPreSpawnRefusals(x)),
    "retry(retry(gate(third-party)))": lambda x: RetryPreSpawnRefusals(
        RetryPreSpawnRefusals(_gate(OnlyOverridesTeardown(x)))
    ),
}

ARGS: dict[str, tuple[Any, ...]] = {
    "execute": (ExecutionSpec("n"),),
    "teardown": (1.0,),
    "result": (0.0,),
}


def _call(obj: Any, name: str) -> Any:
    attr = getattr(obj, name)
    return attr(*ARGS.get(name, ())) if callable(attr) else attr


def test_the_enumerated_interface_is_the_protocols_and_nothing_is_left_out() -> None:
    assert set(REQUIRED_SURFACES) == _protocol_members(Executor)
    assert set(OPTIONAL_SURFACES) == _protocol_members(OptionalSurfaces)
    assert {"release_retained", "recover", "cancel", "accounting"} <= set(OPTIONAL_SURFACES)
    assert {"execute", "teardown"} <= set(REQUIRED_SURFACES)
    for name in ALL_SURFACES:  # the default executor implements the whole interface
        assert hasattr(LocalProcessExecutor, name), name
    sig = inspect.signature(Recording.teardown)
    assert "grace" in sig.parameters


@pytest.mark.parametrize("surface_name", ALL_SURFACES)
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_every_surface_reaches_the_inner_executor_through_every_wrapper(
    wrapper: str, surface_name: str
) -> None:
    inner = Recording()
    wrapped = WRAPPERS[wrapper](inner)
    direct = _call(Recording(), surface_name)
    got = _call(wrapped, surface_name)
    assert surface_name in inner.calls, f"{wrapper} dropped {surface_name}"
    assert got == direct


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_an_optional_surface_the_inner_executor_lacks_stays_absent_through_every_wrapper(
    wrapper: str,
) -> None:
    wrapped = WRAPPERS[wrapper](RequiredOnly())
    for name in OPTIONAL_SURFACES:
        assert surface(wrapped, name) is None, name
    for name in REQUIRED_SURFACES:
        _call(wrapped, name)


def test_an_allowlist_wrapper_is_caught_by_the_same_check() -> None:
    """The check has teeth: an allowlist wrapper fails it for every optional surface."""

    class Allowlist:
        def __init__(self, inner: Any) -> None:
            for n in REQUIRED_SURFACES:
                setattr(self, n, getattr(inner, n))

    wrapped = Allowlist(Recording())
    assert {n for n in OPTIONAL_SURFACES if surface(wrapped, n) is None} == set(OPTIONAL_SURFACES)


def test_private_attributes_are_not_forwarded() -> None:
    wrapped = RetryPreSpawnRefusals(Recording())
    with pytest.raises(AttributeError):
        _ = wrapped._calls_that_do_not_exist
    assert "release_retained" in dir(wrapped)
