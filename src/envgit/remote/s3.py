"""The bucket: boto3 (the `remote` extra), imported only here, only by the commands and the
daemon's auto-push that use a remote. Credentials come from the standard AWS chain (the
environment, ~/.aws, SSO, instance roles); `--endpoint` names any S3-compatible server.

boto3 rather than obstore or minio: botocore is already envgit's (the gate's SigV4 re-signing,
the `aws` extra), its retry modes (`adaptive`: exponential backoff with jitter plus a client
side rate limiter that slows down on throttling) and its managed transfers (multipart above a
threshold, parts in parallel) are the ones every AWS tool uses, and it is kept by AWS."""

import io
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

from ..extras import need

need("remote")      # boto3, botocore and urllib3, or one line naming `pip install 'envgit[remote]'`

from urllib3.exceptions import ProtocolError  # noqa: E402

from . import RemoteError  # noqa: E402

MULTIPART_AT = 8 << 20          # packs are sealed at 16 MiB: the big ones go in parts
PART_SIZE = 8 << 20
WORKERS = 16                    # many small objects (indexes, segments) go in parallel
READ_ATTEMPTS = 4               # a body cut off mid-read is read again (botocore retries requests only)


# One client per endpoint, region and credentials named in the environment, kept for the
# process: making one is ~70 ms (botocore loads its service model), most of a small push's own
# time, which the daemon's resident push worker (remote/auto.py) would pay at every push. A
# client is thread-safe and keeps its connections; the worker is let go when idle.
_clients: dict[tuple, object] = {}


class Bucket:
    def __init__(self, remote):
        import boto3
        import botocore.exceptions
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        self._errors = botocore.exceptions
        self.remote, self.bucket, self.prefix = remote, remote.bucket, remote.prefix
        where = (remote.endpoint, remote.region or "us-east-1", os.environ.get("AWS_ACCESS_KEY_ID"),
                 os.environ.get("AWS_PROFILE"))
        self.client = _clients.get(where)
        if self.client is None:
            session = boto3.session.Session()
            self.client = _clients[where] = session.client(
                "s3", endpoint_url=remote.endpoint, region_name=where[1],
                config=Config(retries={"mode": "adaptive", "max_attempts": 10},
                              max_pool_connections=WORKERS * 2, connect_timeout=10, read_timeout=60,
                              s3={"addressing_style": "path"} if remote.endpoint else {}))
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_AT, multipart_chunksize=PART_SIZE,
                                       max_concurrency=4, use_threads=True)

    def key(self, name: str) -> str:
        return self.prefix + name

    # -- one object -----------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> str:
        """Write the object; returns its ETag as the bucket's listing will show it (push keeps
        them to notice an object changed on the bucket since)."""
        with self._said(name):
            if len(data) >= MULTIPART_AT:
                self.client.upload_fileobj(io.BytesIO(data), self.bucket, self.key(name), Config=self.transfer)
                # a multipart ETag is the server's own (not the MD5 of the bytes): ask for it
                return _etag(self.client.head_object(Bucket=self.bucket, Key=self.key(name)))
            return _etag(self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data))

    def get(self, name: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        with self._said(name):
            for attempt in range(READ_ATTEMPTS):
                try:
                    return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
                except self._errors.ClientError as e:
                    if _code(e) in ("NoSuchKey", "404", "NotFound"):
                        return None
                    raise
                except (self._errors.ResponseStreamingError, self._errors.ReadTimeoutError,
                        self._errors.ConnectionClosedError, ProtocolError):
                    # the body broke off after the request's own retries were done: try the
                    # whole read again, backing off, then say it
                    if attempt == READ_ATTEMPTS - 1:
                        raise
                    time.sleep(min(8.0, 0.25 * 2 ** attempt) * (0.5 + random.random()))
            raise AssertionError("unreachable")     # the last attempt returns or raises

    def delete(self, name: str) -> None:
        with self._said(name):
            self.client.delete_object(Bucket=self.bucket, Key=self.key(name))

    def listing(self, under: str) -> dict[str, str]:
        """name -> ETag of every object whose name starts with `under` (relative names)."""
        out = {}
        with self._said(under):
            for page in self._pages(Prefix=self.key(under)):
                for o in page.get("Contents", ()):
                    out[o["Key"][len(self.prefix):]] = _etag(o)
        return out

    def _pages(self, **kw):
        """list_objects_v2 page after page (botocore's paginator costs a model load: ~0.15 s
        of every push's start)."""
        token = None
        while True:
            page = self.client.list_objects_v2(Bucket=self.bucket, **kw,
                                               **({"ContinuationToken": token} if token else {}))
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def children(self, under: str) -> list[str]:
        """The names of the "directories" right below `under` (its common prefixes)."""
        out = []
        with self._said(under):
            for page in self._pages(Prefix=self.key(under), Delimiter="/"):
                for p in page.get("CommonPrefixes", ()):
                    out.append(p["Prefix"][len(self.key(under)):].rstrip("/"))
        return out

    # -- many objects ---------------------------------------------------------------------
    def map(self, fn, items, progress=None):
        """fn(item) for every item, WORKERS at a time; results in order. `progress(item,
        result)` after each."""
        items = list(items)
        if not items:
            return []
        with ThreadPoolExecutor(min(WORKERS, len(items))) as pool:
            futures = [pool.submit(fn, i) for i in items]
            out = []
            for item, f in zip(items, futures, strict=True):
                out.append(f.result())
                if progress is not None:
                    progress(item, out[-1])
            return out

    def _said(self, name):
        return _Said(self, name)


class _Said:
    """Turns the client's failures into one RemoteError line naming the object and the fix."""

    def __init__(self, bucket, name):
        self.b, self.name = bucket, name

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, RemoteError):
            return False
        errors = self.b._errors
        where = f"s3://{self.b.bucket}/{self.b.key(self.name)}" + (
            f" at {self.b.remote.endpoint}" if self.b.remote.endpoint else "")
        if isinstance(e, errors.NoCredentialsError):
            raise RemoteError(f"{where}: no AWS credentials (set AWS_ACCESS_KEY_ID/"
                              "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials)") from None
        if isinstance(e, errors.ClientError):
            code = _code(e)
            if code == "NoSuchBucket":
                raise RemoteError(f"{where}: no such bucket; create it, or fix the remote's URL "
                                  f"(`envgit remote set {self.b.remote.name} --url …`)") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                raise RemoteError(f"{where}: access denied ({code}); check the AWS credentials "
                                  "and the bucket's policy") from None
            raise RemoteError(f"{where}: {code}: {e}") from None
        if isinstance(e, (errors.EndpointConnectionError, errors.ConnectionError,
                          errors.BotoCoreError, ProtocolError)):
            raise RemoteError(f"{where}: {e}; check --endpoint and the network, then run "
                              "the command again (a push resumes)") from None
        return False


def _etag(response) -> str:
    """An object's ETag without the quotes some servers put around it in one answer and not
    in another (rclone: quoted from a PUT, bare in a listing)."""
    return str(response.get("ETag") or "").strip('"')


def _code(e) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))
