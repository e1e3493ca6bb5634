"""Model Context Protocol servers as ral commands: the pure rules (docs/mcp.md).

``config``: what a ``[mcp.NAME]`` table, the ``--mcp`` flag and the config files say; ``values``:
an MCP result as a ral value and a ral map as tool arguments; ``replies``: the recorded results
a replay serves instead of a server. The fleet-owned client is ``actors/mcp_hub.py``.
"""
