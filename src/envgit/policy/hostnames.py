"""Host names and addresses as the gate compares them, pure: how an entry is spelled (`host`,
`host:port`, `[v6]:port`, `*.domain`), which names are special (IP literals in every spelling,
loopback, cloud metadata), and the one canonical spelling of the place a host names. No I/O:
parsing an address never looks it up."""

import ipaddress
import re
import socket
from functools import lru_cache

METADATA_NAMES = ("metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal", "metadata.azure.internal")
METADATA_IPS = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                ipaddress.ip_address("100.100.100.200"))
_LEGACY_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$")


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def norm_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def ip_literal(host: str):
    """The address `host` spells, also in the legacy IPv4 forms a resolver accepts, or None."""
    h = norm_host(host)
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if _LEGACY_V4.match(h):
        try:
            return ipaddress.ip_address(socket.inet_aton(h))   # pure parsing, no lookup
        except OSError:
            return None
    return None


_NAT64_WKP = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_v4(ip) -> tuple:
    """The IPv4 addresses an IPv6 address leads to: `::ffff:a.b.c.d`, and NAT64 (RFC 6052):
    the well-known prefix 64:ff9b::/96 and the local-use 64:ff9b:1::/48, whose prefix length
    the network chooses (/48, /56, /64 or /96: every embedding is taken)."""
    if ip.version != 6:
        return ()
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    b = ip.packed
    if ip in _NAT64_WKP:
        return (ipaddress.IPv4Address(b[12:16]),)
    if ip in _NAT64_LOCAL:
        return tuple(ipaddress.IPv4Address(x) for x in (b[6:8] + b[9:11], b[7:8] + b[9:12],
                                                        b[9:13], b[12:16]))
    return ()


def is_special(host: str) -> str | None:
    """Why `host` is reachable only when named exactly, or None for an ordinary name."""
    h = norm_host(host)
    ip = ip_literal(h)
    if ip is not None:
        if ip in METADATA_IPS or any(v4 in METADATA_IPS for v4 in embedded_v4(ip)):
            return "a cloud metadata address"
        return "an IP address; name the host instead"
    if h in METADATA_NAMES:
        return "a cloud metadata name"
    if h == "localhost" or h.endswith(".localhost"):
        return "a loopback name"
    return None


# Suffixes no public host is under (RFC 6762 .local, RFC 6761 .localhost, the cloud providers'
# and home routers' private zones, reverse lookups): a name under one is a place inside.
_PRIVATE_SUFFIXES = ("internal", "local", "localhost", "localdomain", "lan", "home", "corp",
                     "intranet", "private", "arpa")


def not_suggested(host: str) -> str | None:
    """Why envgit must never offer a line that allows `host` (a step chose it: a raw DNS query
    or a request to the gate costs it nothing), or None for a host it may suggest. The one
    place that decides it: the gate's own special addresses (is_special: every IP literal in
    any spelling, the metadata names, localhost), and any name not under a public-looking
    suffix (a single label, .internal, .local, ...). A person who means such a host names it
    in network.allow themselves."""
    h = norm_host(host)
    special = is_special(h)
    if special:
        return special.split(";")[0]
    labels = h.split(".")
    if len(labels) < 2 or "" in labels:
        return "a single-label name"
    tld = labels[-1]
    if tld in _PRIVATE_SUFFIXES or not (tld.isalpha() or tld.startswith("xn--")) or len(tld) < 2:
        return "a name under a private suffix"
    return None


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def split_entry(entry: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]:port`, `*.domain` -> (normalised host pattern, port or None)."""
    e = entry.strip()
    if e.startswith("["):
        host, _, rest = e[1:].partition("]")
        return norm_host(host), int(rest[1:]) if rest.startswith(":") else None
    if e.count(":") == 1:
        host, port = e.split(":")
        return norm_host(host), int(port)
    return norm_host(e), None


def host_matches(pattern: str, host: str) -> bool:
    """`pattern` is a name, `*.domain` (names under domain) or a preset `name.*` (a name
    starting with that label)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    if pattern.endswith(".*"):
        return host.startswith(pattern[:-1])
    if pattern == host:
        return True
    a, b = ip_literal(pattern), ip_literal(host)
    return a is not None and a == b


@lru_cache(maxsize=4096)          # pure, and asked for every rule of every request
def canonical_host(host: str) -> str:
    """The one spelling of the place `host` names, as the gate compares places: every loopback
    spelling (localhost, 127.0.0.0/8, ::1, ::ffff:127.x.y.z, legacy forms) is 'localhost' (the
    gate takes them for one authority on a port: network._same_place); an IPv4-mapped IPv6 address is
    its IPv4 address (a dual-stack socket connects there); any other IP literal its compressed
    form; a name as norm_host spells it."""
    h = norm_host(host)
    if h == "localhost":
        return h
    ip = ip_literal(h)
    if ip is None:
        return h
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return "localhost" if ip.is_loopback else str(ip)


@lru_cache(maxsize=4096)
def places(host: str) -> frozenset:
    """Every canonical place a connection to `host` can reach: canonical_host, and for an IPv6
    address that leads to IPv4 through NAT64 (embedded_v4) those IPv4 addresses too."""
    c = canonical_host(host)
    ip = ip_literal(c)
    return frozenset((c, *(canonical_host(str(v4)) for v4 in (embedded_v4(ip) if ip else ()))))


def rule_host_matches(pattern: str, host: str) -> bool:
    """Does a rule's host pattern (an irreversible `net:` rule, a network.deny entry, a
    network.l7 key) apply to `host`? As host_matches, and also for every other spelling of the
    same place (places): a rule that restricts 127.0.0.1 restricts localhost and [::1] on that
    port, one on 192.168.1.10 restricts [::ffff:192.168.1.10]. (network.allow stays exact:
    allowing one spelling does not open the others.)"""
    return host_matches(pattern, host) or bool(places(pattern) & places(host))


def entry_matches(entry: str, host: str, port: int, exact: bool = False) -> bool:
    pat, eport = split_entry(entry)
    if exact and pat.startswith("*."):
        return False
    return host_matches(pat, norm_host(host)) and (port in (80, 443) if eport is None else port == eport)



def rule_entry_matches(entry: str, host: str, port: int) -> bool:
    """Does a rule's host entry (`host` or `host:port`; no port: any port) apply to host:port?"""
    pat, eport = split_entry(entry)
    return rule_host_matches(pat, norm_host(host)) and (eport is None or eport == port)


def hostport(host, port) -> str:
    """host:port as a person reads it: the port left out when it is 80 or 443."""
    host = f"[{host}]" if ":" in host else host
    return host if port in (80, 443) else f"{host}:{port}"
