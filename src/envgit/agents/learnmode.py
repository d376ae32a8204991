"""`envgit claude --learn`, `envgit codex --learn`: the agent's whole session in learn mode
(daemon/learn.py), switched on over the daemon's own socket by the launcher, before the
agent starts, and off when it exits. Nothing the agent or its steps do can reach that socket."""

import sys


def switch(project, session: str, on: bool) -> str | None:
    """Learn mode on (or off) for `session`; the refusal's text when it cannot be (the policy
    forbids it, the daemon is not there)."""
    from ..daemon.client import DaemonError, connect
    try:
        conn = connect(project, start=on)
        try:
            reply = conn.request({"op": "learn", "action": "on" if on else "off", "session": session})
        finally:
            conn.close()
    except (DaemonError, OSError) as e:
        return f"envgit: learn mode: {e}"
    return reply.get("error")


def announce(agent: str) -> None:
    print(f"envgit: LEARN MODE IS ON for this {agent} session: what the policy would deny (a host "
          "not in network.allow, a method or path network.l7 does not list) is let through and "
          "recorded; irreversible rules, secrets and credentials apply as always",
          file=sys.stderr)
