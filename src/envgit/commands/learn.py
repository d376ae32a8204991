"""`envgit learn on|off`, `envgit learn`: learn mode for the rest of the session (every step
of the project's session daemon, until `off` or the daemon stops), and whether it is on.
`envgit learn -- CMD` (one step in learn mode) is dispatched before argparse (cli.py, run.py).
What learn mode lets through and what it never does: policy/learn.py, daemon/learn.py."""

from ..paths import find_project
from . import Usage, ask_daemon, command, iso_utc, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "learn", help="learn mode: let through and record what the policy would deny "
                "(never an irreversible action, a secret or a credential)",
                usage="envgit learn [on | off] | envgit learn -- CMD [ARG…]",
                example=["envgit learn -- npm test        # one step in learn mode",
                         "envgit learn on                 # every step of the session, until:",
                         "envgit learn off",
                         "envgit learn                    # whether it is on"])
    s.add_argument("action", nargs="?", choices=("on", "off"),
                   help="on: every step of the session from now on; off: none")
    json_flag(s)
    s.set_defaults(fn=cmd_learn)


def cmd_learn(args):
    project = find_project()
    if args.action is None:
        reply = _status(project)
    else:
        reply = ask_daemon(project, {"op": "learn", "action": args.action})
    doc = {"on": bool(reply.get("on")), "since": iso_utc(reply.get("since")),
           "sessions": list(reply.get("sessions") or []), "forbidden": reply.get("forbidden")}
    if args.json:
        out(doc)
        return 0
    if doc["on"]:
        print(f"learn mode is on for every step of this session (since {doc['since']}): what the "
              "policy would deny is let through and recorded; `envgit learn off` ends it")
    elif doc["sessions"]:
        print(f"learn mode is on for the agent sessions {', '.join(doc['sessions'])} only")
    else:
        print("learn mode is off" + (f" ({doc['forbidden'].removeprefix('envgit: ')})"
                                     if doc["forbidden"] else ""))
    return 0


def _status(project) -> dict:
    """The daemon's answer; no daemon running: off (learn mode lives in the daemon)."""
    from ..daemon.client import DaemonError, connect
    try:
        conn = connect(project, start=False)
    except DaemonError:
        return {"on": False}
    try:
        reply = conn.request({"op": "learn", "action": "status"})
    finally:
        conn.close()
    if "error" in reply:
        raise Usage(reply["error"].removeprefix("envgit: "))
    return reply

