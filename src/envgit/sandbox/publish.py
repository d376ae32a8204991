"""Ports a step publishes (`envgit run -p 5173`, `network.publish` in the policy): a server the
step starts inside, reached by the person at the host's 127.0.0.1 while the step runs.

The step's network namespace has no way in, so each published port has a socket file in a
directory of the step's own, bound in at /run/envgit/publish: inside, socat listens on
`<port>.sock` and for every connection opens 127.0.0.1:<port> (or [::1]:<port>, when the
server listens there only: a dev server bound to `localhost` may be either) in the namespace.
Outside, the session daemon listens on the host's 127.0.0.1:<host port> (never any other
interface) and joins each connection to that socket file (daemon/publish.py), opening it
without following a link the step may have put in its place. The host's listeners close when
the step ends.

A port below 1024 cannot be listened on inside (nobody in the sandbox may bind one); a port
that network.allow forwards to the host (loopback.py: a server on the host the step reaches)
cannot also be published: the forwarder already listens there inside.
"""

from ..policy.ports import PublishError, parse
from . import loopback, network

INSIDE = "/run/envgit/publish"
MAX_PORTS = 32


def ports(values, network_allow) -> list[tuple[int, int]]:
    """Every port asked for, checked: (host port, step port), each host port once."""
    out: list[tuple[int, int]] = []
    values = list(values or [])
    if len(values) > MAX_PORTS:
        raise PublishError(f"{len(values)} ports to publish: at most {MAX_PORTS}")
    forwarded = {port for host, port in loopback.forwards(network_allow or [])
                 if host in loopback.LOOPBACK_V4 + loopback.LOOPBACK_NAMES}
    for value in values:
        host_port, step_port = parse(value)
        if step_port in forwarded:
            raise PublishError(
                f"port {step_port} is both published and in network.allow as a loopback host: the "
                f"step reaches a server on the host at that port, so one the step starts cannot "
                f"listen there too; publish another port (-p {host_port}:{step_port + 1} with the "
                f"server on {step_port + 1}) or take the loopback entry out of network.allow")
        if (host_port, step_port) in out:
            continue                    # the policy's and -p's alike: once
        if any(h == host_port for h, _ in out):
            raise PublishError(f"host port {host_port} is published twice")
        out.append((host_port, step_port))
    return out


def mounts(host_dir: str) -> list[str]:
    return ["--dir", "/run/envgit", "--bind", host_dir, INSIDE]


def wrap(argv: list[str], step_ports: list[int]) -> list[str]:
    """`argv` started once a listener serves each published port's socket file inside. Like
    the bridge, it leaves fds 0, 1, 2 to the command and no other open."""
    if not step_ports:
        return argv
    socat = network._socat()
    lines, wait = [], []
    for port in sorted(set(step_ports)):
        sock = f"{INSIDE}/{port}.sock"
        # The second try only when the first could not connect at all (socat exits 1 before
        # reading a byte, so what the person's client sent is still there for it). The
        # addresses go in variables: socat would split its SYSTEM command at their colons.
        lines.append(f"(S={socat} V4=TCP4:127.0.0.1:{port} V6=TCP6:[::1]:{port} "
                     f"$ss {socat} UNIX-LISTEN:{sock},fork,unlink-early,mode=600 "
                     "'SYSTEM:$S - $V4 2>/dev/null || exec $S - $V6' </dev/null >/dev/null 2>&1 &)")
        wait.append(sock)
    script = network.SETSID + "\n".join(lines) + "\n" + _WAIT.format(socks=" ".join(wait)) + 'exec "$@"\n'
    return ["/bin/sh", "-c", script, "envgit-publish", *argv]


_WAIT = """\
i=0
for s in {socks}; do
  while [ ! -S "$s" ] && [ $i -lt 1000 ]; do i=$((i+1)); [ $i -gt 50 ] && sleep 0.01; done
  [ -S "$s" ] || echo "envgit: the listener for a published port did not start ($s)" >&2
done
unset i s
"""
