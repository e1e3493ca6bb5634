"""Durable state: append-only files and the durability policy, event logs, the spawn journal,
snapshots and the binding log, the session directory and its readers."""
