"""The engine's async shell: where the pure machine meets I/O.

:class:`~accord.engine.runtime.orchestrator.Engine` loads a run, applies the machine
(:mod:`accord.engine.machine`), commits the transition through the ports
(:mod:`accord.engine.ports`) and hands the outbox to the dispatcher. Beside it run the timer
service, outcome intake, the reconciler and the in-process actions. Nothing here imports an
adapter: adapters are opened from URLs by :mod:`accord.adapters`.
"""
