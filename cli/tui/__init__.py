"""The interactive frontend (``exarch-actors chat``), built on textual."""

from cli.tui.app import ChatApp

__all__ = ["ChatApp"]
