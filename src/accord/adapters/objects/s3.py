"""An S3 bucket as an object store (``s3://bucket[/prefix]?endpoint=…``), with boto3.

Requests are signed with SigV4 and addressed path-style (``endpoint/bucket/key``), which every
S3-compatible server accepts (SeaweedFS, MinIO, AWS). ``if_absent`` sends ``If-None-Match: *``:
the server answers 412 when the key exists, and that is :class:`ObjectExists`. Errors are
translated at this edge and nothing else: 404/``NoSuchKey`` → :class:`ObjectNotFound`,
403/``AccessDenied`` → :class:`ObjectDenied`, 5xx, connection and timeout errors →
:class:`ObjectUnavailable`. Retries are few and timeouts short, so a stopped server is reported in
seconds, not minutes. botocore's DEBUG records that hold a signature (``botocore.auth`` logs the
canonical request and the signature of every signed URL) are dropped at their loggers.
Credentials come from the constructor or boto3's chain, never the URL; :attr:`url` shows the
bucket and endpoint only.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from accord.objects.ports import (
    ObjectDenied,
    ObjectError,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectUnavailable,
    Operation,
    StoredObject,
    check_key,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3ObjectStore"]

_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})
_DENIED = frozenset({"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "Forbidden", "AllAccessDisabled"})  # fmt: skip
_EXISTS = frozenset({"412", "PreconditionFailed"})
_METHODS: dict[str, str] = {"get": "get_object", "put": "put_object"}
_SECRET_MARKS = ("Signature", "X-Amz-Credential", "Authorization", "X-Amz-Security-Token")


class _NoSignatures(logging.Filter):
    """Drop botocore's DEBUG records that carry a signature, a canonical request or an
    ``Authorization`` header: a signed URL is a bearer capability and never reaches a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "botocore.auth":
            return False
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            return False
        return not any(mark in text for mark in _SECRET_MARKS)


for _name in ("botocore.auth", "botocore.endpoint", "botocore.hooks", "botocore.httpsession",
              "botocore.parsers", "botocore.retryhandler", "urllib3.connectionpool"):  # fmt: skip
    logging.getLogger(_name).addFilter(_NoSignatures())


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None,
        prefix: str = "",
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 30.0,
    ) -> None:
        if not bucket:
            raise ValueError("s3 object store: the URL names no bucket (s3://bucket/…)")
        self.bucket, self.endpoint, self.region = bucket, endpoint, region
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session()
        self._client: S3Client = session.client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=config,
        )

    @classmethod
    def from_url(
        cls, url: str, *, access_key: str | None = None, secret_key: str | None = None
    ) -> S3ObjectStore:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = sorted(set(query) - {"endpoint", "region"})
        if unknown:
            raise ValueError(f"s3 object store URL: unknown parameter(s) {', '.join(unknown)}")
        if parts.username or parts.password:
            raise ValueError("s3 object store URL: credentials never go in the URL")
        return cls(
            parts.hostname or "",
            endpoint=query.get("endpoint"),
            prefix=parts.path,
            region=query.get("region", "us-east-1"),
            access_key=access_key,
            secret_key=secret_key,
        )

    @property
    def url(self) -> str:
        where = f"?endpoint={self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    @property
    def client(self) -> S3Client:
        """The boto3 client (for administration: buckets, lifecycle rules)."""
        return self._client

    def _key(self, key: str) -> str:
        try:
            return self.prefix + check_key(key)
        except ValueError as exc:
            raise ObjectDenied(str(exc), key=key[:200]) from None

    def put(
        self,
        key: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        if_absent: bool = False,
    ) -> ObjectInfo:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": data,
                                "Metadata": dict(metadata or {})}  # fmt: skip
        if if_absent:
            args["IfNoneMatch"] = "*"
        with _Translated(key):
            self._client.put_object(**args)
        return ObjectInfo(key, len(data), dict(metadata or {}))

    def get(self, key: str) -> StoredObject:
        with _Translated(key):
            reply = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            data = reply["Body"].read()
        return StoredObject(key, data, dict(reply.get("Metadata", {})))

    def head(self, key: str) -> ObjectInfo:
        with _Translated(key):
            reply = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        return ObjectInfo(key, int(reply["ContentLength"]), dict(reply.get("Metadata", {})))

    def delete(self, key: str) -> None:
        with _Translated(key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        keys: list[str] = []
        with _Translated(prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            cut = len(self.prefix)
            for page in pages:
                keys.extend(o["Key"][cut:] for o in page.get("Contents", []))
        return sorted(keys)

    def presign(self, key: str, operation: Operation, expires_s: int) -> str:
        if expires_s < 1:
            raise ObjectDenied("a signed URL must live at least one second", key=key)
        return self._client.generate_presigned_url(
            _METHODS[operation],
            Params={"Bucket": self.bucket, "Key": self._key(key)},
            ExpiresIn=int(expires_s),
        )

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (set-up and tests)."""
        with _Translated(""):
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if _code(exc) not in _NOT_FOUND:
                    raise
                self._client.create_bucket(Bucket=self.bucket)

    def lifecycle_rules(self) -> builtins.list[dict[str, Any]]:
        """The bucket's lifecycle rules (none: an empty list)."""
        with _Translated(""):
            try:
                reply = self._client.get_bucket_lifecycle_configuration(Bucket=self.bucket)
            except ClientError as exc:
                if _code(exc) in ("NoSuchLifecycleConfiguration", "404"):
                    return []
                raise
        return [dict(rule) for rule in reply.get("Rules", [])]

    def apply_expiry_rule(self, rule_id: str, prefix: str, days: int) -> dict[str, Any]:
        """Put (or replace) the rule ``rule_id`` expiring objects under this store's prefix plus
        ``prefix`` after ``days`` days; every other rule of the bucket is kept as it was."""
        if days < 1:
            raise ValueError("lifecycle expiry is day-granular: days must be at least 1")
        rule: dict[str, Any] = {"ID": rule_id, "Status": "Enabled",
                                "Filter": {"Prefix": self.prefix + prefix},
                                "Expiration": {"Days": int(days)}}  # fmt: skip
        rules = [r for r in self.lifecycle_rules() if r.get("ID") != rule_id] + [rule]
        with _Translated(""):
            self._client.put_bucket_lifecycle_configuration(
                Bucket=self.bucket,
                LifecycleConfiguration={"Rules": rules},  # type: ignore[typeddict-item]
            )
        return rule

    def close(self) -> None:
        self._client.close()


def _code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


class _Translated:
    """Turn boto3's errors into the port's, naming the key and never a URL or credential."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or isinstance(exc, ObjectError):
            return
        if isinstance(exc, ClientError):
            code = _code(exc)
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _NOT_FOUND:
                raise ObjectNotFound("no object at the key", key=self.key) from None
            if code in _EXISTS:
                raise ObjectExists("an object already exists at the key", key=self.key) from None
            if code in _DENIED:
                raise ObjectDenied(f"the store refused access ({code})", key=self.key) from None
            if status >= 500:
                raise ObjectUnavailable(f"the store failed ({code})", key=self.key) from None
            said = f"the store answered {code}"
            raise ObjectUnavailable(said, key=self.key, retryable=False) from None
        if isinstance(exc, BotoCoreError):
            why = f"the store cannot be reached ({type(exc).__name__})"
            raise ObjectUnavailable(why, key=self.key) from None
