"""``python -m exarch_actors`` and the ``exarch-actors`` console script: the command line
(``cli/main.py``)."""

from __future__ import annotations

from exarch_actors.cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
