"""`envgit policy replay CANDIDATE`: every request the journal recorded judged again by a
candidate policy (policy/replay.py, on the gate's own network.decide_request), compared with
what was recorded. Reads the journal and the candidate; writes nothing.

Exit 1 when the candidate newly allows a request an irreversible rule covers, 0 otherwise,
2 when the candidate does not load (its file:line:col, as `envgit policy check` says it)."""

import re
import sys

from ..inert import inert
from . import Usage, json_flag, open_journal, out


def add_parser(psub, command):
    from .args import since
    x = command(psub, "replay", help="judge every recorded request again with a candidate policy: "
                "per step what it newly allows, denies or asks (exit 1: it newly allows an "
                "irreversible action)",
                example=["envgit policy replay candidate.yaml", "envgit policy replay candidate.yaml "
                         "--since 2h --json", "envgit policy replay candidate.yaml --steps 3..9"])
    x.add_argument("candidate", metavar="CANDIDATE", help="the policy file to judge with (loaded as "
                   "envgit.yaml would be: over your defaults, under the organisation's policy)")
    x.add_argument("--since", metavar="WHEN", type=since, default=None,
                   help="only requests since then: a duration back (30m, 2h, 1d) or an ISO-8601 time")
    x.add_argument("--steps", metavar="A..B", type=step_range, default=None,
                   help="only the steps A to B (either end may be left out: 5.., ..9)")
    json_flag(x)


def step_range(text) -> tuple[int, int]:
    import argparse
    m = re.fullmatch(r"(\d*)\.\.(\d*)", str(text))
    if not m or not (m[1] or m[2]):
        raise argparse.ArgumentTypeError(f"{text!r}: give a range of steps A..B (3..9, 5.., ..9)")
    lo, hi = int(m[1] or 1), int(m[2] or (1 << 63) - 1)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"{text!r}: the first step is after the last")
    return lo, hi


def recorded(j, since_ns=None, steps=None) -> list[tuple[int, list[dict]]]:
    """[(step, [request record, ...])] from the journal's request entries, in order."""
    from ..journal.rows import read_body
    if j is None:
        return []
    lo, hi = steps or (0, (1 << 63) - 1)
    with j.lock:
        rows = j.db.execute(
            "SELECT step, body FROM entries WHERE kind = 'request' AND at_ns >= ? AND step BETWEEN ? AND ? "
            "ORDER BY seq", (min(since_ns or 0, (1 << 63) - 1), lo, hi)).fetchall()
    by_step: dict[int, list[dict]] = {}
    for step, text in rows:
        body, _ = read_body("request", text)
        if body:
            by_step.setdefault(step, []).append(body)
    return sorted(by_step.items())


def cmd_replay(args, project) -> int:
    from ..policy import PolicyError, load_policy
    from ..policy.replay import replay
    try:
        candidate = load_policy(args.candidate)
    except PolicyError as e:
        raise Usage("\n".join(str(x) for x in sorted(e.errors, key=lambda x: (str(x.path), x.line, x.col)))
                    if len(e.errors) > 1 else str(e)) from None
    report = replay(candidate, recorded(open_journal(project), args.since, args.steps))
    s = report["summary"]
    code = 1 if s["irreversible_newly_allowed"] else 0
    if args.json:
        out({"candidate": args.candidate, "sha256": candidate.sha256, **report, "exit": code})
        return code
    print(f"replay of {inert(args.candidate)} (sha256 {candidate.sha256[:12]}) over {s['requests']} "
          "recorded request(s)")
    for st in report["steps"]:
        print(f"step {st['step']}")
        for r in st["requests"]:
            print("  " + _line(r))
    print(f"summary: {s['unchanged']} unchanged, {s['newly_allowed']} newly allowed "
          f"({s['irreversible_newly_allowed']} irreversible), {s['newly_denied']} newly denied, "
          f"{s['newly_asked']} newly asked, {s['cannot_replay']} cannot replay")
    if code:
        print(f"envgit: the candidate newly allows {s['irreversible_newly_allowed']} request(s) an "
              "irreversible rule covers (marked IRREVERSIBLE above)", file=sys.stderr)
    return code


def _line(r: dict) -> str:
    port = r.get("port")
    where = f"{r.get('host')}{'' if port in (80, 443, None) else f':{port}'}"
    what = inert(f"{r.get('method')} {where}{r.get('path') or ''}")
    then = r["then"]
    was = f"{then['decision']}" + (f" (answered {then['answer']})" if then.get("answer") else "")
    if r["now"] is None:
        return f"cannot replay  {what}: the record lacks {inert(r['lacks'])}"
    mark = "  IRREVERSIBLE" if r["irreversible"] else ""
    return (f"{r['change']:<13}  {what}{mark}\n      then {was} by {inert(str(then['rule']))}; now "
            f"{r['now']['decision']} by {inert(r['now']['rule'])}")
