"""The PostgreSQL schema as numbered migrations, applied in order and recorded in ``accord_schema``.

A migration is never edited once released: a change is a new entry with the next number.
:data:`SCHEMA_VERSION` is the newest this code knows; a database whose ``accord_schema`` holds a
larger number was migrated by a newer accord and is refused.

JSON documents (state, history entries, payloads, plans) are stored as canonical text, as the
other stores hold them: nothing on the commit path parses them. Labels are ``jsonb`` so
``list_runs`` can filter on them. Times are epoch milliseconds from the store's clock.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

_V1 = """
CREATE TABLE accord_runs (
  run_id text PRIMARY KEY, version bigint NOT NULL, state text NOT NULL,
  history_len integer NOT NULL, status text, workflow text, tenant text,
  updated_at bigint NOT NULL, labels jsonb NOT NULL DEFAULT '{}');
CREATE INDEX accord_runs_status ON accord_runs (status);
CREATE INDEX accord_runs_workflow ON accord_runs (workflow);
CREATE INDEX accord_runs_tenant ON accord_runs (tenant);
CREATE INDEX accord_runs_updated ON accord_runs (updated_at);
CREATE TABLE accord_history (
  run_id text NOT NULL, seq integer NOT NULL, entry text NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE accord_outbox (
  id bigserial PRIMARY KEY, entry_id text NOT NULL UNIQUE, run_id text NOT NULL,
  topic text NOT NULL, payload text NOT NULL, created_at bigint NOT NULL,
  avail_at bigint NOT NULL, owner text);
CREATE INDEX accord_outbox_pending ON accord_outbox (avail_at, id);
CREATE TABLE accord_timers (
  timer_id text PRIMARY KEY, run_id text NOT NULL, due_at bigint NOT NULL,
  payload text NOT NULL, avail_at bigint NOT NULL, owner text);
CREATE INDEX accord_timers_due ON accord_timers (avail_at);
CREATE TABLE accord_plans (digest text PRIMARY KEY, document text NOT NULL,
  stored_at bigint NOT NULL);
CREATE TABLE accord_activations (id bigserial PRIMARY KEY, workflow text NOT NULL,
  digest text NOT NULL, activated_at bigint NOT NULL);
CREATE INDEX accord_activations_wf ON accord_activations (workflow, id);
CREATE TABLE accord_capabilities (worker_id text NOT NULL, capability text NOT NULL,
  expires_at bigint NOT NULL, PRIMARY KEY (worker_id, capability));
CREATE TABLE accord_jobs (
  id bigserial PRIMARY KEY, queue text NOT NULL, message_id text NOT NULL, body bytea NOT NULL,
  state smallint NOT NULL, avail_at bigint NOT NULL, deliveries integer NOT NULL, receipt text,
  published_at bigint NOT NULL, settled_at bigint, reason text, UNIQUE (queue, message_id));
CREATE INDEX accord_jobs_ready ON accord_jobs (queue, avail_at, id) WHERE state = 0;
CREATE INDEX accord_jobs_acked ON accord_jobs (settled_at) WHERE state = 1;
CREATE INDEX accord_jobs_dead ON accord_jobs (queue, settled_at, id) WHERE state = 2
"""

# shards: the count (``accord_meta``), engine beats, shard leases, and a ``shard`` column on the
# claimable rows; rows older than it are given theirs in Python (``crc32``, which SQL lacks) by
# the first store opened on the schema, in the transaction that records the count (see ._db)
_V2 = """
CREATE TABLE accord_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE accord_engines (engine text PRIMARY KEY, expires_at bigint NOT NULL);
CREATE TABLE accord_leases (shard integer PRIMARY KEY, owner text NOT NULL, epoch bigint NOT NULL,
  expires_at bigint NOT NULL);
ALTER TABLE accord_outbox ADD COLUMN shard integer;
ALTER TABLE accord_timers ADD COLUMN shard integer;
CREATE INDEX accord_outbox_shard ON accord_outbox (shard, avail_at, id);
CREATE INDEX accord_timers_shard ON accord_timers (shard, avail_at)
"""

MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _V1), (2, _V2))
SCHEMA_VERSION = MIGRATIONS[-1][0]
