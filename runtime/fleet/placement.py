"""What an agent's host asks of a Ray node: its resource request (``--backend ray``).

A request is ``num_cpus`` and custom resources (``gpu = 1``, ``"accelerator:A100" = 1``), the
names and amounts of Ray's own resources (``ray start --resources``). Every agent gets the
base request (the command line's ``--num-cpus`` and ``--resource NAME=AMOUNT``); a
scenario's ``[placement.PATTERN]`` table sets what it names for the agents whose name is
PATTERN or matches it as a glob (an exact name wins, else the first matching pattern in file
order, as ``[agents.PATTERN]`` does). The Ray backend (``actors/ray_backend.py``) hands a
non-empty request to Ray's scheduler as a placement group of one bundle, held while the host
lives; an empty one reserves nothing (the default: agents mostly wait on a model).

Invariants:
- Amounts are finite and non-negative; a resource name is non-empty and not ``CPU`` (that is
  ``num_cpus``): anything else is :class:`BadResourceRequest`, never a traceback.
- :meth:`ResourceRequest.fits` says whether a node's total resources could ever hold the
  request: an infeasible request is refused at once instead of waiting on Ray forever.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exarch_actors.runtime.errors import ExarchError

PLACEMENT_KEYS = ("num_cpus", "resources")


class BadResourceRequest(ExarchError):
    """A resource request names no resource, a negative or non-numeric amount, or ``CPU``."""


def _amount(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadResourceRequest(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise BadResourceRequest(f"{where}: expected a finite amount >= 0, got {value!r}")
    return float(value)


def _name(where: str, name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise BadResourceRequest(f"{where}: a resource needs a name")
    if name == "CPU":
        raise BadResourceRequest(f"{where}: CPU is asked with num_cpus")
    return name


@dataclass(frozen=True)
class ResourceRequest:
    """An agent host's request: ``None`` for a part it leaves to the base request."""

    num_cpus: float | None = None
    resources: tuple[tuple[str, float], ...] | None = None

    @property
    def empty(self) -> bool:
        return not self.bundle()

    def bundle(self) -> dict[str, float]:
        """Ray's bundle for it: ``CPU`` and each custom resource, zero amounts left out."""
        out = {"CPU": self.num_cpus} if self.num_cpus else {}
        out.update((k, v) for k, v in (self.resources or ()) if v)
        return out

    def fits(self, total: Mapping[str, float]) -> bool:
        """Whether a node with ``total`` resources could hold it at all."""
        return all(total.get(k, 0.0) >= v for k, v in self.bundle().items())

    def over(self, base: ResourceRequest) -> ResourceRequest:
        """This request, with what it leaves unset taken from ``base``."""
        return ResourceRequest(
            base.num_cpus if self.num_cpus is None else self.num_cpus,
            base.resources if self.resources is None else self.resources,
        )

    def describe(self) -> str:
        parts = [f"num_cpus={self.num_cpus:g}"] if self.num_cpus else []
        parts += [f"{k}={v:g}" for k, v in (self.resources or ())]
        return ", ".join(parts) or "nothing"

    @classmethod
    def from_table(cls, where: str, table: Mapping[str, Any]) -> ResourceRequest:
        """A ``[placement.PATTERN]`` table (keys :data:`PLACEMENT_KEYS`; others are the
        caller's to warn about)."""
        cpus = table.get("num_cpus")
        num_cpus = None if cpus is None else _amount(f"{where}.num_cpus", cpus)
        res = table.get("resources")
        if res is None:
            return cls(num_cpus)
        if not isinstance(res, Mapping):
            raise BadResourceRequest(f"{where}.resources: expected a table of amounts")
        pairs = tuple(
            (_name(f"{where}.resources", k), _amount(f"{where}.resources.{k}", v))
            for k, v in res.items()
        )
        return cls(num_cpus, tuple(sorted(pairs)))


def parse_resource(text: str) -> tuple[str, float]:
    """``NAME=AMOUNT`` (``--resource``)."""
    name, sep, amount = text.rpartition("=")
    if not sep:
        raise BadResourceRequest(f"--resource {text!r}: expected NAME=AMOUNT")
    try:
        value = float(amount)
    except ValueError:
        raise BadResourceRequest(f"--resource {text!r}: {amount!r} is not a number") from None
    return _name(f"--resource {text!r}", name), _amount(f"--resource {text!r}", value)


@dataclass(frozen=True)
class PlacementPolicy:
    """Every agent's request: ``base`` under each ``(pattern, request)`` table."""

    base: ResourceRequest = field(default_factory=ResourceRequest)
    tables: tuple[tuple[str, ResourceRequest], ...] = ()

    @classmethod
    def of(
        cls,
        num_cpus: float | None,
        resources: tuple[str, ...],
        tables: tuple[tuple[str, ResourceRequest], ...] = (),
    ) -> PlacementPolicy:
        """From the command line (``--num-cpus``, each ``--resource NAME=AMOUNT``) and a
        scenario's tables."""
        cpus = None if num_cpus is None else _amount("--num-cpus", num_cpus)
        pairs = tuple(sorted(dict(parse_resource(r) for r in resources).items()))
        return cls(ResourceRequest(cpus, pairs or None), tables)

    def for_agent(self, name: str) -> ResourceRequest:
        exact = [r for p, r in self.tables if p == name]
        globbed = [r for p, r in self.tables if fnmatch.fnmatchcase(name, p)]
        table = (exact or globbed or [ResourceRequest()])[0]
        return table.over(self.base)
