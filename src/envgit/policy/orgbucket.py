"""The organisation policy kept as one object in a remote's bucket (`envgit remote add NAME URL
--policy OBJECT`, `envgit remote set NAME --policy OBJECT`): fetched then, and again by every
`envgit push NAME` (the daemon's auto-push too), into a copy outside every project that
`org.locate` reads when /etc/envgit/policy.yaml and $ENVGIT_ORG_POLICY name none. The daemon
never fetches on a step's way: a step's policy is the last copy fetched.

    $XDG_CONFIG_HOME/envgit/org/source.json   {"remote", "object", "url", "sha256", "fetched_at"}
    $XDG_CONFIG_HOME/envgit/org/policy.yaml   the object's bytes, as last fetched and checked

A fetched object that is not a valid policy never replaces the copy (the last good one stays,
and the command says so); an object that is gone from the bucket leaves the copy too. Who can
change the object: whoever may write that key in the bucket; give the machines' credentials
read access only to it (a bucket policy), as the organisation's admins write it.
Standard library only until a fetch (boto3 comes with the remote's code).
"""

import hashlib
import json
import os
import time

from .schema import PolicyError


def org_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "envgit", "org")


def source_path() -> str:
    return os.path.join(org_dir(), "source.json")


def copy_path() -> str:
    return os.path.join(org_dir(), "policy.yaml")


def source() -> dict | None:
    """What the copy was fetched from, or None when no remote names an organisation policy."""
    try:
        with open(source_path()) as f:
            d = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PolicyError(source_path(), 0, 0, f"not readable ({e}); run `envgit remote set "
                          "NAME --policy OBJECT` again") from None
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("remote", "object", "url")):
        raise PolicyError(source_path(), 0, 0, "not an organisation policy's source; run "
                          "`envgit remote set NAME --policy OBJECT` again")
    return d


def label(src: dict) -> str:
    """How errors and `policy show` name the policy: the object's URL on the bucket."""
    return src["url"]


def fetch(remote, obj: str) -> str:
    """Fetch `obj` (a key below the remote's prefix) and, when it is a valid policy, make it
    the organisation policy's copy. Returns what was done, in words. Raises PolicyError (the
    object's own file:line) or the remote's error; the old copy stays then."""
    from ..remote.s3 import Bucket
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
    import tempfile
    from pathlib import Path

    from .load import _read
    with tempfile.NamedTemporaryFile(prefix="envgit-org-", suffix=".yaml") as f:
        f.write(data)
        f.flush()
        _read(Path(f.name), label=url)


def _write(path: str, data: bytes) -> None:
    """Whole or absent; 0644 in a 0755 directory (the daemon of the same user reads it; no one
    else may write it: org.check_trust)."""
    from ..atomicfile import write_atomic
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, data, 0o644)
