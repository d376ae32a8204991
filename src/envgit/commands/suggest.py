"""`envgit policy suggest`: the smallest change to envgit.yaml that lets through what the
recorded steps needed (policy/suggest.py), as a unified diff with each added line's
file:line and the steps that needed it; what is not suggested (irreversible actions, private
hosts, the gate's own refusals) with its steps. The suggestion is loaded as envgit.yaml would
be and replayed over the same journal (policy/replay.py, the gate's own judging): what it
newly allows, the asks and denials it would have saved. `--apply` writes it, atomically, only
when that replay shows it newly allows nothing irreversible.

Exit 0; 1 when --apply refused to write (the replay found an irreversible action newly
allowed, which the suggestion never means to); 2 when envgit.yaml does not load."""

import difflib
import os
import sys

from ..inert import inert, inert_line
from . import Usage, json_flag, out

SHOWN = 3                       # requests named per line; the rest counted


def add_parser(psub, command):
    from .args import since
    from .replay import step_range
    x = command(psub, "suggest", help="the smallest change to envgit.yaml that lets through what "
                "the recorded steps needed: a diff, each line with the steps that needed it "
                "(--apply writes it after a replay shows it newly allows nothing irreversible)",
                example=["envgit policy suggest", "envgit policy suggest --since 2h",
                         "envgit policy suggest --apply"])
    x.add_argument("--since", metavar="WHEN", type=since, default=None,
                   help="only requests since then: a duration back (30m, 2h, 1d) or an ISO-8601 time")
    x.add_argument("--steps", metavar="A..B", type=step_range, default=None,
                   help="only the steps A to B (either end may be left out: 5.., ..9)")
    x.add_argument("--apply", action="store_true", help="write the change to envgit.yaml (atomically; "
                   "only when a replay shows it newly allows nothing irreversible)")
    json_flag(x)


def cmd_suggest(args, project) -> int:
    from ..policy.suggest import shown
    from ..view.policyfigures import compute
    policy, text, sug, candidate, summary, counts = compute(project, args.since, args.steps)
    name = os.path.relpath(project.policy)
    diff = "".join(difflib.unified_diff(text.splitlines(True), sug.text.splitlines(True),
                                        f"a/{name}", f"b/{name}"))
    irreversible = bool(summary and summary["irreversible_newly_allowed"])
    applied, code = False, 0
    if args.apply and sug.changed:
        if irreversible:
            code = 1
        else:
            _write(project.policy, text, sug.text)
            applied = True
    lines = [{"file": name, "line": ln.line, "text": ln.text, "steps": ln.steps,
              "requests": [shown(r) for _, r in ln.needs]} for ln in sug.lines]
    refused = [{"why": n.why, "rule": n.rule, "steps": n.steps, "requests": [shown(r) for _, r in n.needs],
                "answers": n.answers} for n in sug.not_suggested]
    if args.json:
        out({"policy": name, "sha256": policy.sha256, "diff": diff, "lines": lines, "not_suggested": refused,
             "replay": summary, "saved": counts, "applied": applied, "exit": code})
        return code
    if not sug.changed:
        print(f"nothing to suggest: {name} already lets through every recorded request it can")
    else:
        sys.stdout.write("".join(inert_line(ln) for ln in diff.splitlines(True)))
        print("each added line, and the steps that needed it:")
        for ln in lines:
            print(f"  {name}:{ln['line']}: + {inert(ln['text'])}")
            print(f"      step(s) {_steps(ln['steps'])}: {_requests(ln['requests'])}")
    for n in refused:
        a = n["answers"]
        asked = "" if a is None else (f"; asked {a['allow'] + a['deny']} time(s): allowed {a['allow']}"
                                      f" ({a['by_grant']} by a grant), denied {a['deny']}")
        print(f"not suggested: {inert(n['why'])} (rule {inert(n['rule'])}){asked}")
        print(f"      step(s) {_steps(n['steps'])}: {_requests(n['requests'])}")
    if summary is not None:
        print(f"replay of the suggestion over the journal: newly allows {summary['newly_allowed']} "
              f"request(s) ({summary['irreversible_newly_allowed']} irreversible), newly denies "
              f"{summary['newly_denied']}; it would have saved {counts['asks']} ask(s) and "
              f"{counts['denials']} denial(s)")
    if applied:
        print(f"wrote {name}")
    elif code:
        print(f"envgit: not written: the replay shows the change newly allows "
              f"{summary['irreversible_newly_allowed']} irreversible request(s); see "
              "`envgit policy replay` on the diff above", file=sys.stderr)
    elif sug.changed:
        print("to write it: envgit policy suggest --apply")
    return code


def _steps(steps) -> str:
    return ", ".join(str(s) for s in steps)


def _requests(reqs) -> str:
    seen = list(dict.fromkeys(reqs))
    more = f" (+{len(seen) - SHOWN} more)" if len(seen) > SHOWN else ""
    return inert(", ".join(seen[:SHOWN])) + more


def _write(path: str, was: str, text: str) -> None:
    """The new text, whole or not at all, over the file as it was read (a change made since
    is not overwritten)."""
    from ..atomicfile import write_atomic
    try:
        with open(path, encoding="utf-8") as f:
            now = f.read()
        mode = os.stat(path).st_mode & 0o7777
    except OSError as e:
        raise Usage(f"{path}: cannot be read again before writing ({e.strerror})") from None
    if now != was:
        raise Usage(f"{path} changed while the suggestion was made; run envgit policy suggest again")
    try:
        write_atomic(path, text, chmod=mode)
    except OSError as e:
        raise Usage(f"{path}: not written ({e.strerror}); the file is as it was") from None
