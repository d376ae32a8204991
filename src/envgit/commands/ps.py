"""`envgit ps`: the steps running now, with the ports each publishes (sandbox/publish.py), as
the session daemon knows them. No daemon running: no step is."""

from ..inert import inert
from ..paths import find_project
from ..view.names import shell_line
from . import command, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "ps", help="the steps running now and the ports they publish",
                example=["envgit ps", "envgit ps --json"])
    json_flag(s)
    s.set_defaults(fn=cmd_ps)


def running(project) -> list[dict]:
    """[{"id", "argv", "published": [[host port, step port]…]}…], oldest first."""
    from ..daemon.client import DaemonError, connect
    try:
        conn = connect(project, start=False)
    except DaemonError:
        return []                       # no daemon: nothing runs
    try:
        reply = conn.request({"op": "status"})
    finally:
        conn.close()
    return reply.get("steps") or [{"id": s, "argv": [], "published": []} for s in reply.get("live", [])]


def cmd_ps(args):
    steps = running(find_project())
    if args.json:
        out({"steps": steps})
        return 0
    if not steps:
        print("no step is running")
        return 0
    for s in steps:
        ports = ", ".join(f"http://127.0.0.1:{h}/" + (f" (port {p} inside)" if p != h else "")
                          for h, p in s.get("published") or [])
        print(inert(f"{s['id']:>5}  {shell_line(s.get('argv') or [])}" + (f"  published: {ports}" if ports else "")))
    return 0
