"""The `envgit mcp --project ROOT` processes running on the host: what the tests of the server
the daemon runs for an agent's sandbox (daemon/mcphost.py) check is gone."""

import os
import time


def servers_left(root, within_s=10) -> list[int]:
    """Pids of `envgit mcp --project ROOT` processes still running after `within_s` (or at
    once, when none is)."""
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


def settled(pid, quiet_s=1.5, within_s=60) -> None:
    """Until process `pid` has used no CPU for `quiet_s` (its start done: a server waiting on
    its client), at most `within_s`; at once if it has gone. A fixed wait after the server
    appeared was a guess: its imports alone take seconds on a loaded machine."""
    last, since = None, time.monotonic()
    deadline = since + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return
        ticks = int(fields[11]) + int(fields[12])        # utime + stime
        if ticks != last:
            last, since = ticks, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
