"""``accord-metadata-extract-http``: serve ``metadata.extract@2`` over HTTP.

Secrets come from the environment, never the command line: ``ACCORD_CALLBACK_SECRET`` signs the
callbacks (with ``--key-id``), ``ACCORD_JOB_SECRETS`` (``key=whsec_…,key2=whsec_…``) are the
engine's keys a job must be signed with.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import uvicorn

from accord.contracts.sources import find_root, load_catalog
from accord.worker.storage import StorageMap
from accord_worker_metadata_extract_http.app import RemoteWorker, Settings


def _job_secrets(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, secret = item.partition("=")
        if not sep or not key or not secret:
            raise ValueError("ACCORD_JOB_SECRETS is key=whsec_…[,key=whsec_…]")
        out[key] = secret
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accord-metadata-extract-http", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8431)
    parser.add_argument("--callback-url", required=True, help="the API's /v1/callbacks URL")
    parser.add_argument("--key-id", required=True, help="key id the callbacks are signed with")
    parser.add_argument("--storage-root", type=Path, required=True)
    parser.add_argument("--worker-id", default="metadata-extract-http")
    parser.add_argument("--heartbeat-ms", type=int, default=5_000)
    parser.add_argument("--ca-file", type=Path, help="CA bundle for an https callback URL")
    parser.add_argument("--acceptance-db", default=".accord/remote-acceptance.sqlite")
    parser.add_argument(
        "--contracts", type=Path, help="contract sources (default schemas/contracts)"
    )
    parser.add_argument("--certfile", type=Path, help="serve https with this certificate")
    parser.add_argument("--keyfile", type=Path)
    args = parser.parse_args(argv)
    secret = os.environ.get("ACCORD_CALLBACK_SECRET", "")
    try:
        jobs = _job_secrets(os.environ.get("ACCORD_JOB_SECRETS", ""))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not secret or not jobs:
        print("error: ACCORD_CALLBACK_SECRET and ACCORD_JOB_SECRETS must be set", file=sys.stderr)
        return 2
    catalog = load_catalog(args.contracts or find_root() / "schemas" / "contracts")
    settings = Settings(
        callback_url=args.callback_url, key_id=args.key_id, secret=secret, job_secrets=jobs,
        storage=StorageMap.local(args.storage_root), catalog=catalog, worker_id=args.worker_id,
        heartbeat_ms=args.heartbeat_ms, ca_file=args.ca_file, acceptance_path=args.acceptance_db,
    )  # fmt: skip
    worker = RemoteWorker(settings)
    uvicorn.run(
        worker.app, host=args.host, port=args.port, log_level="info",
        ssl_certfile=str(args.certfile) if args.certfile else None,
        ssl_keyfile=str(args.keyfile) if args.keyfile else None,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
