"""How a step, an agent, a session, a time, a command line, an answer's channel and a grant
are named, the same in `envgit log`, the page and an export. Everything a step, an agent or
a server chose goes through inert() (inert.py) before it is shown."""

from ..inert import inert


def iso_times(obj):
    """`obj` with every time in it (a key `at` or `*_at` holding a number) as iso_utc text."""
    if isinstance(obj, dict):
        return {k: iso_utc(v) if (k == "at" or k.endswith("_at")) and isinstance(v, (int, float))
                and not isinstance(v, bool) else iso_times(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [iso_times(v) for v in obj]
    return obj


def iso_utc(t) -> str | None:
    """A time as ISO-8601 UTC with microseconds and Z: from epoch seconds (int or float), epoch
    nanoseconds (an int past 10**15), or text already in that form; None stays None."""
    if t is None or isinstance(t, str):
        return t
    from ..journal import utc
    ns = int(t) if isinstance(t, int) and t > 10**15 else int(round(t * 1_000_000_000))
    return utc(ns)


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-")


def shell_word(arg: str) -> str:
    """One argument quoted as a person would type it in bash: bare when it can be, else in
    single quotes, double quotes when it holds a single quote and nothing double quotes would
    expand, and $'…' with escapes (\\n, \\x1b, \\u202e) when it holds controls; always inert."""
    arg = str(arg)
    if arg and all(c in _PLAIN for c in arg):
        return arg
    if inert(arg) != arg:               # a newline, a tab, an escape, a bidi control
        return "$'" + inert(arg.replace("\\", "\\\\").replace("'", "\\'")) + "'"
    if "'" not in arg:
        return f"'{arg}'"
    if not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return "'" + arg.replace("'", "'\\''") + "'"


def shell_line(argv) -> str:
    """A command line as a person would type it (shell_word for each argument), inert."""
    return " ".join(shell_word(a) for a in argv or ())


def what_ran(s) -> str:
    """The command as a person would type it; for an entry of changes made outside envgit
    (marked `outside`, no command), which paths changed."""
    if "outside" in s.marks and not s.argv:
        paths = [p["path"] for p in (s.snapshot or {}).get("paths", [])]
        shown = ", ".join(inert(p) for p in paths[:5]) + (f", … ({len(paths)} paths)" if len(paths) > 5 else "")
        return f"(changed outside envgit: {shown or 'nothing listed'})"
    return shell_line(s.argv) or "-"


def agent_of(session: str | None) -> str:
    """Which launcher made a session: `claude`, `codex`, `copilot` (its id starts with the agent's
    name: agents/session.py), else `run` (the daemon's own session: `envgit run` by hand)."""
    s = session or ""
    head = s.split("-", 1)[0]
    if not s or (head[:1] == "s" and head[1:].isdigit()) or not head.isalpha():
        return "run"
    return head


def session_short(session: str | None) -> str:
    """The session as the log's column shows it: agent and the id's last part (`claude:3fa2`)."""
    return f"{agent_of(session)}:{(session or '-').rsplit('-', 1)[-1]}"


# How an answer arrived, from the approval entry's `how` (and `who`), in the order shown.
CHANNELS = ("terminal", "cli", "ui", "grant", "elicitation", "timeout", "other")


def channel_of(a: dict) -> str:
    """The channel an approval (or an MCP ask note) was answered through."""
    how, who = str(a.get("how") or ""), str(a.get("who") or "")
    if a.get("channel") in CHANNELS:
        return a["channel"]
    if a.get("granted_by") or how == "grant":
        return "grant"
    if who == "timeout" or how.startswith("no answer"):
        return "timeout"
    if how.startswith("at the terminal"):
        return "terminal"
    if how == "ui" or how.startswith("ui;") or how.startswith("ui "):
        return "ui"
    if how.startswith("envgit "):
        return "cli"
    if how.startswith("MCP elicitation") or who == "agent-client":
        return "elicitation"
    return "other"


def origin(scheme, host, port) -> str:
    """scheme://host, with :port unless it is the scheme's own (a dev server's :5173 is kept)."""
    default = {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(scheme or "")
    return f"{scheme}://{host}" + ("" if port in (None, default) else f":{port}")


def grant_line(g: dict) -> str:
    """What a grant covers, in one inert line."""
    s = g["scope"]
    where = f"{s['scheme']}://{s['host']}" + ("" if s["port"] in (80, 443) else f":{s['port']}")
    if s["effect"] == "git-push":
        what = f"git push to {where}{s['repository']} " + ", ".join(f"{r['action']} {r['ref']}" for r in s["refs"])
    elif s["effect"] == "graphql":
        what = f"{s['method']} {where}{s['path']} GraphQL " + "; ".join(
            f"{o['type']} {o['name'] or '(anonymous)'}" for o in s["operations"])
    else:
        path = s.get("path_glob") or s["path"]
        what = f"{s['method']} {where}{path}" + (" (same query)" if s.get("query_sha256") else "")
        if s.get("method_override"):
            what += f" as {','.join(s['method_override'])}"
    return inert(what)
