"""The request the gate judges and the decision it gets: the types the proxy (envgit.proxy)
and the judging (network.py, netrules.py, approval.py) share. Pure: no I/O."""

from collections.abc import Mapping
from dataclasses import dataclass, field

# What the gate buffers of a request body to judge it (the rest is streamed on once judged):
# a push's pkt-line command section (about 100 bytes a ref) and any real GraphQL document fit.
BODY_CAP = 1 << 20



@dataclass(frozen=True)
class Request:
    scheme: str                              # "http" | "https" (of the request, not the proxy)
    host: str                                # where it goes: URL authority, Host, or CONNECT
    port: int
    method: str
    path: str                                # as sent, without the query
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)   # lower-case names
    body: bytes | None = None                # with Content-Encoding undone; None: none or unreadable
    body_error: str = ""                     # why the body could not be decoded, if it could not
    body_complete: bool = True               # False: `body` is its first BODY_CAP bytes only
    connect_host: str | None = None          # the CONNECT target, when inside a tunnel
    connect_port: int | None = None
    sni: str | None = None                   # TLS server name the client sent, if any
    # what the body predicates found (netrules.BODY_PREDICATES), so that the gate's judging and
    # its record of the facts read a 1 MiB body once; not an argument: a request made from this
    # one by dataclasses.replace (another body) starts with none
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)


@dataclass(frozen=True)
class Decision:
    action: str                              # "allow" | "deny" | "ask"
    rule: str                                # citable: preset:default/git-push, network.allow, …
    reason: str                              # one line, no newline (it goes into git's output)
    irreversible: bool = False               # the request is an irreversible action
    kind: str = ""                           # e.g. "git push"
    intercept: bool = False                  # (CONNECT) terminate TLS to judge each request
    hint: str = ""                           # what to do instead (for people and models)
    body_rule: str = ""                      # the body predicate of the rule that matched, if any
    watch: "Watch | None" = None             # what to look for in the rest of a body past BODY_CAP


@dataclass(frozen=True)
class Watch:
    """A rule that would match if the part of the body past BODY_CAP (streamed on, not
    judged whole) held every one of `markers`: the gate scans the stream, and cuts the request
    off (the server never receives the chunk that completes them) with `decision`."""
    markers: tuple
    decision: Decision

    def scanner(self):
        return MarkerScan(self.markers)


class MarkerScan:
    """Feed a body chunk by chunk; feed() is True once every marker has been seen (a marker
    split across chunks too), before the chunk that completes them is let through."""

    def __init__(self, markers):
        self.missing = set(markers)
        self.keep = max(map(len, markers)) - 1
        self.tail = b""

    def feed(self, chunk: bytes) -> bool:
        hay = self.tail + chunk
        self.missing = {m for m in self.missing if m not in hay}
        self.tail = hay[-self.keep:] if self.keep else b""
        return not self.missing

