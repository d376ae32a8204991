"""Loopback hosts in network.allow: a dev server or a local registry on the host, reached from
inside at the address the policy names.

Inside, 127.0.0.1 and ::1 are the sandbox's own loopback (its network namespace has nothing
else), and NO_PROXY sends clients there directly, so `curl http://localhost:5173` would find
nothing. For each loopback entry with a port ('127.0.0.1:8000', 'localhost:5173',
'[::1]:4873') a forwarder listens inside at that address and port and opens, for every
connection, a CONNECT to the same host and port through the bridge to the gate: the gate
judges it by the policy (the entry names it exactly, port included; every other loopback port
is refused there) and records each request with its host and port. Clients that ignore the
proxy variables (Node's fetch) reach it too. NO_PROXY stays as it is, so a server a step
starts inside on another port is still its own.

Not forwarded: a port below 1024 (nobody in the sandbox may bind one) and an entry without a
port (ports 80 and 443): such a host is reachable through the proxy only, e.g.
`curl --noproxy '' http://localhost/`.
"""

from ..policy.ports import FIRST_PORT  # nobody in the sandbox may bind a port below it
from . import network

LOOPBACK_V4 = ("127.0.0.1",)
LOOPBACK_V6 = ("::1",)
LOOPBACK_NAMES = ("localhost",)


def forwards(network_allow: list[str]) -> list[tuple[str, int]]:
    """The (host as named, port) of each loopback entry a forwarder serves, in policy order."""
    from ..policy.hostnames import norm_host, split_entry
    out = []
    for entry in network_allow:
        try:
            host, port = split_entry(entry)
        except ValueError:
            continue
        host = norm_host(host)
        if port is None or port < FIRST_PORT or (host, port) in out:
            continue
        if host in LOOPBACK_V4 + LOOPBACK_V6 + LOOPBACK_NAMES:
            out.append((host, port))
    return out


def _listens(host: str) -> list[tuple[str, str]]:
    """(socat listen address type, its bind option) for each address a forwarded host is
    listened for at: a name on both loopbacks, since clients resolve it to either."""
    v4 = ("TCP4-LISTEN", "bind=127.0.0.1")
    v6 = ("TCP6-LISTEN", "bind=[::1],ipv6only=1")
    if host in LOOPBACK_V4:
        return [v4]
    if host in LOOPBACK_V6:
        return [v6]
    return [v4, v6]


def _hex_local(kind: str, port: int) -> str:
    # /proc/net/tcp{,6}'s local_address column for the loopback address and `port`.
    addr = "0100007F" if kind == "TCP4-LISTEN" else "00000000000000000000000001000000"
    return f"{addr}:{port:04X}"


def wrap(argv: list[str], fwd: list[tuple[str, int]], credential: str) -> list[str]:
    """`argv` started after the forwarders listen (run inside network.wrap's bridge, which is
    up by then). Like the bridge, it leaves fds 0, 1, 2 to the command and no other open.
    IPv4 listeners are waited for; an IPv6 one only while the namespace has IPv6."""
    if not fwd:
        return argv
    socat = network._socat()
    lines, taken = [], set()
    want4: list[str] = []
    want6: list[str] = []
    for host, port in fwd:
        target = f"[{host}]" if ":" in host else host
        for kind, bind in _listens(host):
            if (kind, port) in taken:       # 'localhost:P' and '127.0.0.1:P': the first serves
                continue
            taken.add((kind, port))
            lines.append(f"($ss {socat} {kind}:{port},{bind},reuseaddr,fork,nodelay,backlog=128 "
                         f"PROXY:127.0.0.1:{target}:{port},proxyport={network.PORT},"
                         f"proxyauth={credential} </dev/null >/dev/null 2>&1 &)")
            (want4 if kind == "TCP4-LISTEN" else want6).append(_hex_local(kind, port))
    script = network.SETSID + "\n".join(lines) + "\n" + _WAIT.format(
        want4=" ".join(want4), want6=" ".join(want6)) + 'exec "$@"\n'
    return ["/bin/sh", "-c", script, "envgit-loopback", *argv]


# Each table is read on fd 3 with shell builtins (bounded) until every wanted local address is
# listening (state 0A); the IPv6 one only if the namespace has ::1 (/proc/net/if_inet6).
_WAIT = """\
envgit_listening() {{
  table=$1; shift
  for w in "$@"; do
    found=
    while read -r _ local _ state _ <&3; do
      if [ "$local" = "$w" ] && [ "$state" = 0A ]; then found=1; break; fi
    done 3<"$table"
    [ -n "$found" ] || return 1
  done
  return 0
}}
i=0
while ! envgit_listening /proc/net/tcp {want4}; do
  i=$((i+1))
  if [ $i -ge 2000 ]; then
    echo "envgit: the forwarder for a loopback host in network.allow did not start" >&2; break
  fi
done
if [ -n "{want6}" ] && [ -s /proc/net/if_inet6 ]; then
  i=0
  while [ $i -lt 2000 ] && ! envgit_listening /proc/net/tcp6 {want6}; do i=$((i+1)); done
fi
unset -f envgit_listening
unset i
"""
