"""Overlaps between policy entries, judged on their text: can one variable name, host or path
be matched by both of two entries? The organisation merge (orgmerge.py) refuses a project value
that overlaps an organisation's deny; load.py drops an env.pass entry an env.deny covers. Pure:
no I/O (a path entry is resolved against the home it is given)."""

import os

from .decide import abs_match, expand_entry, rel_match
from .globs import has_magic
from .hostnames import host_matches, norm_host, places, split_entry


def env_overlap(a: str, b: str) -> bool:
    """Can one variable name be matched by both `a` and `b` (names, or globs ending in *)?"""
    ag, bg = a.endswith("*"), b.endswith("*")
    a0, b0 = a.rstrip("*"), b.rstrip("*")
    if ag and bg:
        return a0.startswith(b0) or b0.startswith(a0)
    if ag:
        return b0.startswith(a0)
    if bg:
        return a0.startswith(b0)
    return a == b


def hosts_overlap(a: str, b: str) -> bool:
    """Can one host name match both patterns (`name`, `*.domain`, a preset's `name.*`)? Two
    spellings of one place (every loopback spelling, an IPv4 address and its IPv4-mapped IPv6
    form) overlap: the gate applies a rule on one to the others (hostnames.rule_host_matches)."""
    a, b = norm_host(a), norm_host(b)
    if host_matches(a, b) or host_matches(b, a) or places(a) & places(b):
        return True
    if a.startswith("*.") and b.startswith("*."):
        return a.endswith(b[1:]) or b.endswith(a[1:])
    return False


def host_entries_overlap(allow: str, deny: str) -> bool:
    """Does the network.allow entry `allow` reach a host:port the network.deny entry `deny`
    names? (An allow entry without a port is ports 443 and 80; a deny entry without one, every
    port.)"""
    (ah, ap), (dh, dp) = split_entry(allow), split_entry(deny)
    ports = dp is None or (dp in (80, 443) if ap is None else ap == dp)
    return ports and hosts_overlap(ah, dh)


def reopens(allow: str, deny: str, home: str) -> bool:
    """Would the allow_read entry `allow` re-open something the deny_read entry `deny` closes?
    An allow at the same depth or deeper re-opens (decide.is_denied); globs are judged
    conservatively: any overlap counts."""
    for a in expand_entry(allow, home):
        for d in expand_entry(deny, home):
            if a.startswith("/") != d.startswith("/"):
                continue                     # a project glob and a host path: apart
            if a.startswith("/"):
                a, d = os.path.normpath(a), os.path.normpath(d)
                if abs_match(d, a):
                    return True
                if has_magic(a):
                    pre = _literal_prefix(a)
                    if d.startswith(pre) or pre.startswith(d.rstrip("/") + "/"):
                        return True
            elif rel_match(d, a.strip("/")) or rel_match(a.strip("/"), d.strip("/")):
                return True
    return False


def _literal_prefix(glob: str) -> str:
    for i, ch in enumerate(glob):
        if ch in "*?[{":
            return glob[:i]
    return glob

