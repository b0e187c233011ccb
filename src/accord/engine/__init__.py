"""The engine, in three parts that the tree keeps apart.

- :mod:`accord.engine.machine` — the pure state machine (no I/O, no clock, no randomness).
- :mod:`accord.engine.ports` — the typed ports the shell talks to; adapters implement them.
- :mod:`accord.engine.runtime` — the async shell: orchestrator, dispatcher, intake, timers,
  reconciler, holding and coalescing.

See ``docs/architecture.md`` for the layers and the data flow of one run.
"""
