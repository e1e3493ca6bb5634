"""The interactive frontend (``exarch-actors chat``), built on textual: ``app`` (the app),
``model`` (what a tab shows), ``bridge`` (the fleet's events into it), ``widgets``."""
