"""The fleet's rules: inboxes, the spawn tree and its registry, park, nudges, compaction, digests,
the disk warning, probes, supervision and the agent-host protocol."""
