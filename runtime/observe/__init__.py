"""Seeing a fleet after the fact and while it runs: the span model of a session
(``spans.py``), its Chrome trace (``chrome_trace.py``), its HTML report (``report_html.py``)
and the OpenTelemetry export (``otel.py``); docs/observability.md."""
