"""The `envgit mcp --project ROOT` processes running on the host: what the tests of the server
the daemon runs for an agent's sandbox (daemon/mcphost.py) check is gone."""

import os
import time


def servers_left(root, within_s=10) -> list[int]:
    """Pids of `envgit mcp --project ROOT` processes still running after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"mcp" in argv and str(root).encode() in argv:
                left.append(int(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
