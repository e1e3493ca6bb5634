"""Where each package lands (the rest of the metadata is pyproject.toml's).

A wheel installs one top-level package, ``exarch_actors``, with the repository's ``runtime/``,
``actors/``, ``cli/`` and ``examples/`` mapped under it (``exarch_actors/_alias.py`` lets the
source keep importing them by their short names). An editable install (``pip install -e .``,
setuptools' ``editable_wheel`` command) keeps the clone's layout as it is: the three folders
are top-level packages beside ``exarch_actors/``, so a ``python -c "from cli.main import
main"`` from a clone goes on working.
"""

from __future__ import annotations

import sys

from setuptools import find_packages, setup

LAYERS = ("runtime", "actors", "cli")
FOUND = find_packages(include=[f"{top}*" for top in LAYERS])

if "editable_wheel" in sys.argv:
    setup(packages=["exarch_actors", *FOUND])
else:
    setup(
        packages=[
            "exarch_actors",
            "exarch_actors.examples",
            *(f"exarch_actors.{name}" for name in FOUND),
        ],
        package_dir={
            "exarch_actors.examples": "examples",
            **{f"exarch_actors.{top}": top for top in LAYERS},
        },
    )
