"""Joint commits: queue writes that ride inside the store's commit when both share one database.

When the embedded queue lives in the store's own SQLite file and connection, a job message can be
inserted into the queue table by the very transaction that commits the transition which
dispatched it, and an outcome delivery can be acknowledged by the transaction that commits the
event it produced. Both then become one atomic step:

- *transactional dispatch*: the job is in the queue exactly when the attempt is on record, so
  outbox completeness (I7) holds with no outbox row, no publish after the commit and no
  done-mark — three writes fewer per job, and no window for a crash between commit and publish;
- *acknowledge with the commit*: the outcome is settled exactly when its event is durable, so a
  crash can neither lose the event nor redeliver an outcome that was already folded in; and such
  a commit that sends nothing out need not wait for its own fsync (:meth:`Riders.durable`).

The transport offers the joint commit through the :class:`~accord.engine.ports.JointQueue` port;
the shell hands it plain messages and deliveries and never sees a connection. Other entries
(actions, telemetry) and other transports keep the outbox path unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from accord.canonical import canonical_json
from accord.engine.ports import Commit, Delivery, OutboxEntry, QueuedMessage
from accord.engine.runtime.outbox import control_body, control_queue

__all__ = ["durable", "split_outbox"]


def durable(commit: Commit, messages: Sequence[QueuedMessage], acked: Sequence[Delivery]) -> bool:
    """Whether a joint commit needs its own fsync. Not when it settles the delivery that carried
    its event and sends nothing out (no message, no outbox entry): lost in a power cut, it goes
    together with that acknowledgement, the delivery comes again and the event is applied again —
    nothing outside the database saw it. The next durable commit's sync makes it durable anyway
    (the log is written in order)."""
    return not acked or bool(messages) or bool(commit.outbox)


def split_outbox(commit: Commit) -> tuple[Commit, list[QueuedMessage]]:
    """Move the commit's job and cancel entries into queue messages; the rest stays in the
    outbox."""
    messages: list[QueuedMessage] = []
    rest: list[OutboxEntry] = []
    for entry in commit.outbox:
        queue, body = _message(entry)
        if queue is None:
            rest.append(entry)
            continue
        messages.append(QueuedMessage(queue, entry.entry_id, body))
    if len(rest) != len(commit.outbox):
        commit = replace(commit, outbox=tuple(rest))
    return commit, messages


def _message(entry: OutboxEntry) -> tuple[str | None, bytes]:
    """The queue and body the dispatcher would publish ``entry`` as (None: not a message)."""
    topic = entry.topic
    if topic.startswith("job:"):
        return topic[4:], canonical_json(entry.payload.get("envelope", {}))
    if topic.startswith("cancel:"):
        return control_queue(topic[7:] or None), control_body(entry.payload)
    return None, b""
