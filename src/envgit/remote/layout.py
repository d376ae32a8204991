"""Where things are: object names on the bucket and the remote's local configuration
(docs/FORMAT.md, "Remote"). Standard library only."""

import json
import os
import socket
import string
import threading

from . import RemoteError

SEGMENT_DIGITS = 12
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._-")


# --- object names (relative to the remote's prefix) ------------------------------------------

CONFIG = "config"
PROJECTS = "projects/"


def machine_prefix(project: str, machine: str) -> str:
    return f"{PROJECTS}{project}/{machine}/"


def head_name(project: str, machine: str) -> str:
    return machine_prefix(project, machine) + "head"


def version_name(project: str, machine: str, version: int) -> str:
    """The mark a push leaves after its head: head version `version` was written."""
    return machine_prefix(project, machine) + f"heads/{version:0{SEGMENT_DIGITS}d}"


def parse_version(name: str, project: str, machine: str) -> int | None:
    """The version of a head mark's name (below the remote's prefix), None when it is not one."""
    base = machine_prefix(project, machine) + "heads/"
    leaf = name[len(base):] if name.startswith(base) else ""
    return int(leaf) if len(leaf) == SEGMENT_DIGITS and leaf.isdigit() and int(leaf) > 0 else None


def pack_name(project: str, machine: str, name: str) -> str:
    return machine_prefix(project, machine) + "packs/" + name


def index_name(project: str, machine: str, name: str) -> str:
    return machine_prefix(project, machine) + "indexes/" + name


def segment_name(project: str, machine: str, first: int, last: int) -> str:
    return machine_prefix(project, machine) + f"journal/{first:0{SEGMENT_DIGITS}d}-{last:0{SEGMENT_DIGITS}d}"


def parse_segment(leaf: str) -> tuple[int, int] | None:
    """(first, last) of a segment's last path part, None when it is not one."""
    a, sep, b = leaf.partition("-")
    if not sep or len(a) != SEGMENT_DIGITS or len(b) != SEGMENT_DIGITS or not (a.isdigit() and b.isdigit()):
        return None
    first, last = int(a), int(b)
    return (first, last) if 1 <= first <= last else None


def check_name(text: str, what: str) -> str:
    if not (1 <= len(text) <= 64) or text[0] == "." or not set(text) <= _NAME_CHARS:
        raise RemoteError(f"{what} {text!r}: give 1-64 of A-Z a-z 0-9 . _ - (not starting with .)")
    return text


def machine_name() -> str:
    """This machine's name on remotes: $ENVGIT_MACHINE, else the host name (made safe)."""
    given = os.environ.get("ENVGIT_MACHINE")
    if given:
        return check_name(given, "ENVGIT_MACHINE")
    return _safe(socket.gethostname().split(".")[0]) or "machine"


def project_name(root: str) -> str:
    """A project's name on remotes: $ENVGIT_PROJECT, else its directory's name (made safe)."""
    given = os.environ.get("ENVGIT_PROJECT")
    if given:
        return check_name(given, "ENVGIT_PROJECT")
    return _safe(os.path.basename(os.path.realpath(root))) or "project"


def _safe(text: str) -> str:
    return "".join(c if c in _NAME_CHARS else "_" for c in text).lstrip(".")[:64]


# --- the local configuration -------------------------------------------------------------------

def config_dir() -> str:
    """$XDG_CONFIG_HOME/envgit/remotes (default ~/.config/envgit/remotes): outside every project."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "envgit", "remotes")


def key_path(name: str) -> str:
    return os.path.join(config_dir(), name + ".key")


def _conf_path(name: str) -> str:
    return os.path.join(config_dir(), name + ".json")


def seen_path(name: str) -> str:
    return os.path.join(config_dir(), name + ".seen.json")


def parse_url(url: str) -> tuple[str, str]:
    """s3://BUCKET[/PREFIX] -> (bucket, prefix with a trailing "/" or "")."""
    if not url.startswith("s3://"):
        raise RemoteError(f"{url!r}: give the remote as s3://BUCKET/PREFIX")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise RemoteError(f"{url!r}: no bucket; give s3://BUCKET/PREFIX")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


class Remote:
    """One configured remote: its URL, endpoint, region, `auto` and key."""

    def __init__(self, name: str, url: str, endpoint: str | None = None, region: str | None = None,
                 auto: bool = False):
        self.name, self.url, self.endpoint, self.region, self.auto = name, url, endpoint, region, auto
        self.bucket, self.prefix = parse_url(url)

    def to_json(self) -> dict:
        return {"url": self.url, "endpoint": self.endpoint, "region": self.region, "auto": self.auto}

    def key(self) -> bytes:
        path = key_path(self.name)
        try:
            with open(path) as f:
                text = f.read().strip()
        except FileNotFoundError:
            raise RemoteError(f"{path}: the key of remote {self.name} is missing; put your backup "
                              f"of it back there (mode 0600)") from None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise RemoteError(f"{path}: not a remote key (64 hex digits); put your backup of it back")
        return key

    def save(self) -> None:
        write_private(_conf_path(self.name), (json.dumps(self.to_json(), indent=2) + "\n").encode())


def load(name: str) -> Remote:
    check_name(name, "remote name")
    path = _conf_path(name)
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        known = ", ".join(names()) or "none yet"
        raise RemoteError(f"no remote {name!r} (remotes: {known}); add it with "
                          f"`envgit remote add {name} s3://BUCKET/PREFIX --endpoint URL`") from None
    except ValueError as e:
        raise RemoteError(f"{path}: not a remote's configuration ({e}); remove it and "
                          f"`envgit remote add {name} …` again") from None
    try:
        return Remote(name, d["url"], d.get("endpoint"), d.get("region"), bool(d.get("auto")))
    except (KeyError, TypeError):
        raise RemoteError(f"{path}: no url; remove it and `envgit remote add {name} …` again") from None


def names() -> list[str]:
    try:
        return sorted(f[:-5] for f in os.listdir(config_dir())
                      if f.endswith(".json") and not f.endswith(".seen.json"))
    except FileNotFoundError:
        return []


def auto_remotes() -> list[Remote]:
    out = []
    for n in names():
        try:
            r = load(n)
        except RemoteError:
            continue
        if r.auto:
            out.append(r)
    return out


def remove(name: str) -> None:
    for path in (_conf_path(name), seen_path(name)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def write_private(path: str, data: bytes) -> None:
    """Write a file only its owner reads (0600, in a 0700 directory), complete or absent."""
    from ..atomicfile import write_atomic
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, data, 0o600)


# --- the highest head version seen per project and machine (a rolled-back head) -----------

def seen_heads(name: str) -> dict:
    try:
        with open(seen_path(name)) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


_SEEN_LOCK = threading.Lock()


def note_heads(name: str, versions: dict) -> None:
    """Remember each head version seen (never lowering one). Readers of several machines at
    once (audit) call it from their threads."""
    with _SEEN_LOCK:
        _note_heads(name, versions)


def _note_heads(name: str, versions: dict) -> None:
    seen = seen_heads(name)
    changed = False
    for k, v in versions.items():
        if isinstance(v, int) and v > seen.get(k, 0):
            seen[k] = v
            changed = True
    if changed:
        write_private(seen_path(name), (json.dumps(seen, sort_keys=True) + "\n").encode())
