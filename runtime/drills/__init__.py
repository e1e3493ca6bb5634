"""Drills: the invariant checker and what it reads, the nemesis, the fault switch."""
