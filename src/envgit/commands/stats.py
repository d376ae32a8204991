"""`envgit stats`: how often a person was asked, who answered and how, what grants took over,
what was refused, what was let out that cannot be taken back. Read from the journal only."""

import time

from ..inert import inert
from ..paths import find_project
from ..view.names import CHANNELS, channel_of
from . import command, iso_utc, json_flag, open_journal, out


def add_parsers(sub, argparse):
    from .args import since
    s = command(sub, "stats", help="asks per hour, who answered them and how, grants used, denials, "
                "irreversible allows", example=["envgit stats", "envgit stats --since 7d --json"])
    s.add_argument("--since", metavar="WHEN", type=since, default=None,
                   help="count from then: a duration back (30m, 2h, 1d; default 1d) or an ISO-8601 time")
    json_flag(s)
    s.set_defaults(fn=cmd_stats)


def collect(j, since_ns: int) -> dict:
    """The figures, from the journal's approval, request and MCP-ask entries since `since_ns`."""
    from ..journal.rows import read_body
    rows = []
    if j is not None:               # no journal: nothing ran, nothing was asked
        with j.lock:
            rows = j.db.execute(
                "SELECT step, kind, at_ns, body FROM entries WHERE at_ns >= ? AND kind IN "
                "('approval', 'request', 'note') ORDER BY seq", (min(since_ns, (1 << 63) - 1),)).fetchall()
    per_hour: dict[int, int] = {}
    channels = {c: 0 for c in CHANNELS}
    by_who: dict[str, int] = {}
    answers = {"allow": 0, "deny": 0}
    grants: dict[str, int] = {}
    denials = irreversible = 0
    asked_steps = set()
    for step, kind, at, text in rows:
        body, _ = read_body(kind, text)
        if not body:
            continue
        if kind == "request":
            if body.get("decision") == "deny" or body.get("answer") == "deny":
                denials += 1
            elif body.get("irreversible") and (body.get("decision") == "allow" or body.get("answer") == "allow"):
                irreversible += 1
            continue
        if kind == "note":
            # an MCP tool call's ask: counted here only when the agent's client answered it
            # (elicitation) or nobody did; one put to `envgit approve` has its approval entry
            if body.get("type") != "mcp-ask" or body.get("channel") == "daemon" or \
                    str(body.get("how", "")).startswith("the MCP client did not declare"):
                continue
        ch = channel_of(body)
        channels[ch] += 1
        answer = "allow" if body.get("answer") in ("allow", "allow-rule") else "deny"
        answers[answer] += 1
        if ch == "grant":
            grants[body.get("granted_by") or "?"] = grants.get(body.get("granted_by") or "?", 0) + 1
            continue                    # nobody was asked
        who = "agent-client" if ch == "elicitation" else str(body.get("who") or "?")
        by_who[who] = by_who.get(who, 0) + 1
        hour = at // 3_600_000_000_000
        per_hour[hour] = per_hour.get(hour, 0) + 1
        asked_steps.add(step)
    return {
        "since_at": since_ns, "until_at": time.time_ns(),
        "asks": sum(per_hour.values()),
        "asks_per_hour": [{"hour_at": h * 3_600_000_000_000, "asks": n} for h, n in sorted(per_hour.items())],
        "steps_asked": len(asked_steps),
        "answered_by": by_who, "answered_how": channels, "answers": answers,
        "grants_used": sum(grants.values()), "grant_uses": grants,
        "denials": denials, "irreversible_allows": irreversible,
    }


def cmd_stats(args):
    project = find_project()
    since = args.since if args.since is not None else time.time_ns() - 86400 * 1_000_000_000
    s = collect(open_journal(project), since)
    from ..vm import memstore  # backend: vm: what its memory snapshots take
    s["memory_snapshots"] = memstore.usage(project)
    if args.json:
        s["since_at"], s["until_at"] = iso_utc(s["since_at"]), iso_utc(s["until_at"])
        for h in s["asks_per_hour"]:
            h["hour_at"] = iso_utc(h["hour_at"])
        out(s)
        return 0
    print(f"since {iso_utc(s['since_at'])}: {s['asks']} asks of a person in {s['steps_asked']} step(s), "
          f"{s['grants_used']} allowed by grants, {s['denials']} requests denied, "
          f"{s['irreversible_allows']} irreversible requests allowed")
    if s["asks_per_hour"]:
        print("asks per hour:")
        for h in s["asks_per_hour"]:
            print(f"  {iso_utc(h['hour_at'])[:13]}h  {h['asks']:>4}  " + "#" * min(h["asks"], 60))
    how = ", ".join(f"{c} {n}" for c, n in s["answered_how"].items() if n)
    print(f"answered how: {how or 'none'}")
    who = ", ".join(f"{inert(w)} {n}" for w, n in sorted(s["answered_by"].items(), key=lambda x: -x[1]))
    print(f"answered by: {who or 'nobody'}")
    if s["grant_uses"]:
        print("grants used: " + ", ".join(f"{inert(g)} {n}" for g, n in sorted(s["grant_uses"].items())))
    if s["memory_snapshots"]["count"]:
        m = s["memory_snapshots"]
        print(f"VM memory snapshots: {m['count']}, {m['bytes'] / 1e6:.0f} MB on disk (`envgit gc` drops old ones)")
    return 0
