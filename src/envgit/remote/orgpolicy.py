"""The organisation policy kept as one object in a remote's bucket (`envgit remote add NAME URL
--policy OBJECT`, `envgit remote set NAME --policy OBJECT`): fetched then, and again by every
`envgit push NAME` (the daemon's auto-push too), into the copy outside every project that
`policy.org.locate` reads when /etc/envgit/policy.yaml and $ENVGIT_ORG_POLICY name none
(policy/orgcopy.py says where the copy is). The daemon never fetches on a step's way: a step's
policy is the last copy fetched.

A fetched object that is not a valid policy never replaces the copy (the last good one stays,
and the command says so); an object that is gone from the bucket leaves the copy too. Who can
change the object: whoever may write that key in the bucket; give the machines' credentials
read access only to it (a bucket policy), as the organisation's admins write it.
Standard library only until a fetch (boto3 comes with s3.py).
"""

import hashlib
import json
import os
import time

from ..policy.load import parse
from ..policy.orgcopy import copy_path, source, source_path
from ..policy.schema import PolicyError


def fetch(remote, obj: str) -> str:
    """Fetch `obj` (a key below the remote's prefix) and, when it is a valid policy, make it
    the organisation policy's copy. Returns what was done, in words. Raises PolicyError (the
    object's own file:line) or the remote's error; the old copy stays then."""
    from .s3 import Bucket
    url = f"s3://{remote.bucket}/{remote.prefix}{obj}"
    data = Bucket(remote).get(obj)
    if data is None:
        raise PolicyError(url, 0, 0, "no such object in the bucket; upload the organisation "
                          f"policy there first (aws s3 cp policy.yaml {url})")
    _check(data, url)
    sha = hashlib.sha256(data).hexdigest()
    old = source()
    _write(copy_path(), data)
    _write(source_path(), (json.dumps({"remote": remote.name, "object": obj, "url": url,
                                       "sha256": sha, "fetched_at": time.time()}, indent=2)
                           + "\n").encode())
    if old and old.get("sha256") == sha and old.get("url") == url:
        return f"the organisation policy {url} is unchanged"
    return f"the organisation policy is now {url} (sha256 {sha[:12]})"


def refresh(remote) -> str | None:
    """After a push to `remote`: fetch its organisation policy again, if it holds the one in
    use. None when it does not."""
    src = source()
    if src is None or src["remote"] != remote.name:
        return None
    return fetch(remote, src["object"])


def forget(name: str) -> bool:
    """`remote set NAME --policy ''` or `remote remove NAME`: stop using its policy."""
    src = source()
    if src is None or src["remote"] != name:
        return False
    for p in (source_path(), copy_path()):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return True


def _check(data: bytes, url: str) -> None:
    """The bytes as load.py reads a policy file: refused with the object's line when invalid."""
    parse(data, url)


def _write(path: str, data: bytes) -> None:
    """Whole or absent; 0644 in a 0755 directory (the daemon of the same user reads it; no one
    else may write it: policy.org.check_trust)."""
    from ..atomicfile import write_atomic
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, data, 0o644)
