"""`envgit stats`: how often a person was asked, who answered and how, what grants took over,
what was refused, what was let out that cannot be taken back; and what the change `envgit
policy suggest` would make to envgit.yaml would have saved of those asks and denials (the
suggestion replayed over the same journal). Read from the journal and envgit.yaml only."""

import time

from ..inert import inert
from ..paths import find_project
from . import command, iso_utc, json_flag, open_journal, out


def add_parsers(sub, argparse):
    from .args import since
    s = command(sub, "stats", help="asks per hour, who answered them and how, grants used, denials, "
                "irreversible allows", example=["envgit stats", "envgit stats --since 7d --json"])
    s.add_argument("--since", metavar="WHEN", type=since, default=None,
                   help="count from then: a duration back (30m, 2h, 1d; default 1d) or an ISO-8601 time")
    json_flag(s)
    s.set_defaults(fn=cmd_stats)


def cmd_stats(args):
    from ..view.policyfigures import collect, suggested
    project = find_project()
    since = args.since if args.since is not None else time.time_ns() - 86400 * 1_000_000_000
    s = collect(open_journal(project), since)
    from ..vm import memstore  # backend: vm: what its memory snapshots take
    s["memory_snapshots"] = memstore.usage(project)
    s["suggested"] = suggested(project, since)
    if args.json:
        s["since_at"], s["until_at"] = iso_utc(s["since_at"]), iso_utc(s["until_at"])
        for h in s["asks_per_hour"] + s["denials_per_hour"]:
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
    if s["denials_per_hour"]:
        print("denials per hour:")
        for h in s["denials_per_hour"]:
            print(f"  {iso_utc(h['hour_at'])[:13]}h  {h['denials']:>4}  " + "#" * min(h["denials"], 60))
    g = s["suggested"]
    if g is not None and g["lines"]:
        print(f"the suggested policy (envgit policy suggest, {g['lines']} line(s)) would have saved "
              f"{g['asks_saved']} ask(s) and {g['denials_saved']} denial(s) of these")
    elif g is not None:
        print("the suggested policy: nothing to suggest (envgit policy suggest)")
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
