"""Model-facing prompt files (package data): ``system.md`` and its per-agent fragments."""
