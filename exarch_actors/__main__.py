"""``python -m exarch_actors`` and the ``exarch-actors`` console script: the command line
(``cli/main.py``), reached through this package so its short import names resolve when
installed from a wheel (``exarch_actors/_alias.py``)."""

from __future__ import annotations

from cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
