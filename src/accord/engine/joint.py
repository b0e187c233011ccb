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

The transport offers *riders* — opaque operations the store runs inside the commit — through the
:class:`JointQueue` protocol; the shell never sees a connection. Other entries (actions,
telemetry) and other transports keep the outbox path unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from accord.canonical import canonical_json
from accord.engine.outbox import control_queue
from accord.engine.ports import Commit, Delivery, OutboxEntry

__all__ = ["JointQueue", "Rider", "Riders", "split_outbox"]

Rider = Callable[[Any], object]  # run by the store inside its commit transaction


@runtime_checkable
class JointQueue(Protocol):
    """What a transport sharing the store's database offers the shell."""

    def shares_database(self, store: object) -> bool: ...

    def publish_rider(self, queue: str, message_id: str, body: bytes) -> Rider: ...

    def ack_rider(self, delivery: Delivery) -> Rider: ...

    def riders_committed(self, queues: Iterable[str], acked: Iterable[Delivery]) -> None:
        """After the commit: wake consumers of ``queues``, release the ``acked`` deliveries."""
        ...


@dataclass(slots=True)
class Riders:
    """The riders of one commit, with what to tell the transport once it is durable."""

    ops: list[Rider]
    queues: list[str]
    acked: list[Delivery]

    @property
    def inline(self) -> int:
        return len(self.queues)

    def durable(self, commit: Commit) -> bool:
        """Whether the commit needs its own fsync. Not when it settles the delivery that carried
        its event and sends nothing out (no message, no outbox entry): lost in a power cut, it
        goes together with that acknowledgement, the delivery comes again and the event is
        applied again — nothing outside the database saw it. The next durable commit's sync
        makes it durable anyway (the log is written in order)."""
        return not self.acked or bool(self.queues) or bool(commit.outbox)


def split_outbox(
    commit: Commit, joint: JointQueue, acked: Sequence[Delivery] = ()
) -> tuple[Commit, Riders]:
    """Move the commit's job and cancel entries into riders; the rest stays in the outbox."""
    riders = Riders([joint.ack_rider(d) for d in acked], [], list(acked))
    rest: list[OutboxEntry] = []
    for entry in commit.outbox:
        queue, body = _message(entry)
        if queue is None:
            rest.append(entry)
            continue
        riders.ops.append(joint.publish_rider(queue, entry.entry_id, body))
        riders.queues.append(queue)
    if len(rest) != len(commit.outbox):
        commit = replace(commit, outbox=tuple(rest))
    return commit, riders


def _message(entry: OutboxEntry) -> tuple[str | None, bytes]:
    """The queue and body the dispatcher would publish ``entry`` as (None: not a message)."""
    topic = entry.topic
    if topic.startswith("job:"):
        return topic[4:], canonical_json(entry.payload.get("envelope", {}))
    if topic.startswith("cancel:"):
        return control_queue(topic[7:] or None), canonical_json(entry.payload)
    return None, b""
