"""Where each package lands (the rest of the metadata is pyproject.toml's).

One top-level package, ``exarch_actors``, in a wheel and in an editable install alike. The
repository keeps ``runtime/``, ``actors/`` and ``cli/`` at its top level; ``exarch_actors/``
holds a symbolic link to each, so ``exarch_actors.runtime`` *is* ``runtime/`` in a clone (and
for mypy), and the wheel's build copies the files the links reach. Every source file imports
the long names (``from exarch_actors.runtime.errors import ...``): nothing claims ``runtime``,
``actors`` or ``cli`` in a user's process, so a package of that name beside it is never
shadowed. The examples are packaged too (``exarch-actors run fanout`` from a wheel).
"""

from __future__ import annotations

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["exarch_actors", "exarch_actors.*"])  # follows the links

setup(
    packages=[*PACKAGES, "exarch_actors.examples"],
    package_dir={"exarch_actors.examples": "examples"},
)
