"""`envgit policy replay CANDIDATE`: every request the journal recorded judged again by a
candidate policy (policy/replay.py, on the gate's own network.decide_request), compared with
what was recorded. `--against REV`: compared instead with what envgit.yaml as it is in git
revision REV decides (the candidate defaults to envgit.yaml as it is now): a CI gate on a
change to the policy. Reads the journal, the candidate and git; writes nothing.

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
                         "--since 2h --json", "envgit policy replay candidate.yaml --steps 3..9",
                         "envgit policy replay --against main"])
    x.add_argument("candidate", metavar="CANDIDATE", nargs="?", default=None,
                   help="the policy file to judge with (loaded as envgit.yaml would be: over your "
                   "defaults, under the organisation's policy); with --against, envgit.yaml when left out")
    x.add_argument("--against", metavar="REV", default=None,
                   help="compare with envgit.yaml as it is in git revision REV of the project (a "
                   "branch, tag or commit) instead of the recorded decisions: exit 1 when the "
                   "candidate newly allows an irreversible action REV's policy does not")
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


def at_revision(project, rev: str) -> str:
    """envgit.yaml's text as it is in git revision `rev` of the project."""
    import subprocess
    try:
        def git(*argv):
            return subprocess.run(["git", *argv], cwd=project.root, capture_output=True, text=True, timeout=60)
        inside = git("rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        raise Usage("git is not installed; --against reads envgit.yaml from a git revision "
                    "(install git, or give the old policy as a file: envgit policy replay FILE)") from None
    if inside.returncode != 0:
        raise Usage(f"{project.root} is not in a git repository; --against reads envgit.yaml from a "
                    "revision of it (git init and commit it, or replay a file instead)")
    if rev.startswith("-") or git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
        raise Usage(f"no revision {rev!r} in the git repository of {project.root}; name a branch, "
                    "tag or commit (git log --oneline)")
    shown = git("show", f"{rev}:./envgit.yaml")
    if shown.returncode != 0:
        raise Usage(f"revision {rev!r} has no envgit.yaml here; name a revision that has one "
                    f"(git log --oneline -- envgit.yaml)")
    return shown.stdout


def cmd_replay(args, project) -> int:
    from ..policy import PolicyError, load_policy
    from ..policy.replay import replay
    from ..view.policyfigures import errors_text, load_text, rebased, recorded
    if args.candidate is None and args.against is None:
        raise Usage("name the candidate policy file (envgit policy replay FILE), or a git revision "
                    "to compare envgit.yaml with (envgit policy replay --against main)")
    name = args.candidate or project.policy
    try:
        candidate = load_policy(name)
    except PolicyError as e:
        raise Usage(errors_text(e)) from None
    steps = recorded(open_journal(project), args.since, args.steps)
    if args.against is not None:
        base = load_text(project, at_revision(project, args.against), f"{args.against}:envgit.yaml")
        steps = rebased(base, steps)
    report = replay(candidate, steps)
    s = report["summary"]
    code = 1 if s["irreversible_newly_allowed"] else 0
    if args.json:
        out({"candidate": name, "sha256": candidate.sha256, "against": args.against, **report, "exit": code})
        return code
    versus = f" against {inert(args.against)}'s envgit.yaml" if args.against else ""
    print(f"replay of {inert(name)} (sha256 {candidate.sha256[:12]}){versus} over {s['requests']} "
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
