"""Record a run, replay it offline: fleets as regression tests (docs/scenarios.md, "Recording
and replay").

- :mod:`runtime.replay.recording` — the recorded form (an ordinary scenario, appended reply by
  reply) and its writer;
- :mod:`runtime.replay.provider` — the provider wrapper that hands every reply to the writer;
- :mod:`runtime.replay.volatile` — the rules that blank volatile parts before comparing;
- :mod:`runtime.replay.divergence` — what each agent's ral calls returned then and now, and the
  first divergence per agent.
"""
