"""A free port for a server that must be named before it listens (`envgit run -p PORT`, sshd's
config, `rclone serve s3 --addr`, `envgit ui --port`).

Not bind(0)'s port: the kernel hands that out again at the next bind(0) anywhere on the machine,
and between the test's close of its probe and the server's bind the six workers' servers,
gates, browsers and clients take theirs from that same range (one took the port first, once in
a while, and the test failed on "address in use" or reached the wrong server). A port below
the kernel's ephemeral range is never given to a bind(0) or a connect(): only another test's
own choice here could take it, at random out of thousands.
"""

import random
import socket

LOWEST = 20000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the ephemeral range."""
    high = _ephemeral_low() - 1
    if high <= LOWEST:                     # a machine whose ephemeral range starts low: bind(0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(1000):
        port = random.randint(LOWEST, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {LOWEST} and {high}")
