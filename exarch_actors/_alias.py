"""The installed layout's import names: ``runtime``, ``actors`` and ``cli`` as seen by this
distribution's own code.

The wheel installs one top-level package, ``exarch_actors``, holding the three as subpackages
(``setup.py``), while every source file keeps importing them by their short names
(``from runtime.errors import ...``), as it does in a clone. :class:`ShortNames` makes those
imports work there:

- **One module, one name.** ``import runtime.errors`` made by our code gives the module
  ``exarch_actors.runtime.errors`` itself, registered under both keys of ``sys.modules``: a
  class is defined once, its ``__module__`` is the long name, and a pickle of it (a fork-server
  child, a Ray worker) names ``exarch_actors.runtime.errors``, which any process with the wheel
  installed imports without this finder being installed first (importing it installs it).
- **What it cannot do.** Python keeps one module per name in a process: once this package's
  code has imported ``cli``, that name is ours in the whole process, and a package of another
  distribution called ``cli`` (or ``runtime``, ``actors``) cannot be imported beside it; one
  imported before this package is refused by :func:`install_short_names` with
  :class:`ShortNameTaken`.
  On disk the names never collide: nothing but ``exarch_actors`` lands in site-packages.

In a clone (``pip install -e .``, pytest with ``pythonpath = ["."]``) the three folders are
top-level packages and this finder is not installed (:func:`install_short_names` finds no
subpackage).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = __name__.rpartition(".")[0]
"""``exarch_actors``: the long names' prefix."""

SHORT_NAMES = ("runtime", "actors", "cli")
"""The packages the source imports by their short names."""

_HERE = Path(__file__).resolve().parent


def installed_layout() -> bool:
    """Whether the three packages are subpackages here (an installed wheel), not folders beside
    this package (a clone)."""
    return all((_HERE / name / "__init__.py").is_file() for name in SHORT_NAMES)


class ShortNameTaken(ImportError):
    """A module of another distribution holds one of the short names in this process already."""


class ShortNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``runtime``/``actors``/``cli`` (and below) and loads each as the module of its long
    name (see the module docstring)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """The alias spec of ``fullname`` if it is a short name imported by our code."""
        if fullname.partition(".")[0] not in SHORT_NAMES:
            return None
        real = importlib.util.find_spec(f"{PACKAGE}.{fullname}")
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname,
            self,
            origin=real.origin,
            is_package=real.submodule_search_locations is not None,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The long name's module itself (imported now if it is not yet)."""
        module = importlib.import_module(f"{PACKAGE}.{spec.name}")
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the long name's import ran it); the module keeps its own spec,
        which the import system just replaced with the alias's."""
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", None)


def install_short_names() -> bool:
    """Put :class:`ShortNames` first on ``sys.meta_path`` once, in the installed layout only;
    whether it is installed."""
    if not installed_layout():
        return False
    for name in SHORT_NAMES:
        held = sys.modules.get(name)
        if held is not None and held is not sys.modules.get(f"{PACKAGE}.{name}"):
            raise ShortNameTaken(
                f"a package named {name!r} ({getattr(held, '__file__', None)}) is imported "
                f"already: exarch_actors needs the name for its own subpackage "
                f"in this process; rename that package"
            )
    if not any(isinstance(f, ShortNames) for f in sys.meta_path):
        sys.meta_path.insert(0, ShortNames())
    return True
