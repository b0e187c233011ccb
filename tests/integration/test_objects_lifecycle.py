"""``accord objects lifecycle apply|show`` against real SeaweedFS: the rule lands on the bucket
(day-granular, a day past the cache's TTL), re-applying replaces only Accord's rule, and bad
input is refused naming the option, with one JSON document under ``--json``."""

from __future__ import annotations

import json
import uuid

from tests.services import ensure_seaweedfs
from typer.testing import CliRunner

from accord.adapters.objects.s3 import S3ObjectStore
from accord.cli import app


def invoke(*args: str) -> tuple[int, str]:
    server = ensure_seaweedfs()
    access, secret = server.credentials()
    env = {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
    result = CliRunner().invoke(app, ["objects", "lifecycle", *args], env=env)
    return result.exit_code, result.output


def test_apply_puts_the_rule_and_keeps_other_rules() -> None:
    server = ensure_seaweedfs()
    bucket = f"accord-lc-{uuid.uuid4().hex[:8]}"
    access, secret = server.credentials()
    store = S3ObjectStore(bucket, endpoint=server.endpoint, access_key=access, secret_key=secret)
    try:
        store.ensure_bucket()
        store.apply_expiry_rule("someone-elses", "logs/", 30)
        url = f"s3://{bucket}/tenant-data?endpoint={server.endpoint}"
        code, out = invoke("apply", "--objects", url, "--ttl-days", "7", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["rule"]["Expiration"] == {"Days": 8}
        assert report["rule"]["Filter"] == {"Prefix": "tenant-data/cache/"}
        code, out = invoke("apply", "--objects", url, "--ttl-days", "0.5", "--json")
        assert code == 0, out
        rules = {r["ID"]: r for r in store.lifecycle_rules()}
        assert set(rules) == {"someone-elses", "accord-cache-expiry"}
        assert rules["accord-cache-expiry"]["Expiration"]["Days"] == 2
        assert rules["someone-elses"]["Expiration"]["Days"] == 30
        code, out = invoke("show", "--objects", url, "--json")
        assert code == 0 and len(json.loads(out)["rules"]) == 2
    finally:
        store.close()


def test_bad_input_is_refused_naming_the_option(tmp_path: object) -> None:
    code, out = invoke("apply", "--objects", "file:///tmp/x", "--json")
    doc = json.loads(out)
    assert code == 2 and "a directory has no lifecycle rules" in json.dumps(doc)
    code, out = invoke("apply", "--objects", "gs://bucket", "--json")
    assert code == 2 and "--objects" in json.dumps(json.loads(out))
    code, out = invoke("apply", "--objects", "s3://bucket?endpoint=http://x", "--ttl-days", "0")
    assert code == 2 and "--ttl-days" in out and "Traceback" not in out
    code, out = invoke("apply", "--objects", "s3://accord-lc-x?endpoint=http://127.0.0.1:9",
                       "--json")  # fmt: skip
    assert code == 1 and "cannot be reached" in json.dumps(json.loads(out))
