"""envgit compare: branches side by side (src/envgit/branch/compare.py), and `--run CMD` in each."""

import os
import subprocess
import sys
import threading
import time

from ..inert import inert
from ..paths import Project, find_project
from . import Usage, command, json_flag, out
from .snapshot import para


def add_parsers(sub, argparse):
    s = command(sub, "compare", help="branches side by side: their steps, requests, marks and files",
                example=["envgit compare 1 2 3", "envgit compare main 2 --run 'pytest -q'", "envgit compare r12 main"],
                usage="envgit compare ID ID… [--run CMD] [--json]",
                description=para("Each branch (a fork's id, `r<R>` for the steps rewind R stepped "
                "over, `main` for this working tree) beside the others: its steps and how many "
                "failed, the requests they made (denied, asked), their marks, and every file any "
                "of them changed since its fork point, with a letter per distinct content (the "
                "same letter: the same bytes). Each side is read as its newest snapshot. --run "
                "runs CMD in every side that has a working tree, at once, each as a step of its "
                "own branch, and tabulates exit codes and each output's last line."))
    s.add_argument("ids", nargs="+", metavar="ID", help="`main`, a fork's id, or r<R>")
    s.add_argument("--run", metavar="CMD", help="a shell command run in each branch first, as a step there")
    json_flag(s)
    s.set_defaults(fn=cmd_compare)


def cmd_compare(args):
    project = find_project()
    ids = list(dict.fromkeys(args.ids))
    if len(ids) < 2:
        raise Usage("name at least two branches (`envgit branches` lists them; `main` is this tree)")
    sides = _sides(project, ids)              # checked before anything runs
    runs = run_in_each(sides, args.run) if args.run else None
    if runs is not None:
        sides = _sides(project, ids)          # the run is each side's newest step now
    from ..branch.compare import file_matrix
    files = file_matrix(sides)
    summaries = [s.summary() for s in sides]
    if args.json:
        out({"sides": summaries, "files": files, "run": runs})
        return 0
    _print(summaries, files, runs, args.run)
    return 0


def _sides(project, ids):
    from ..branch import registry
    from ..branch.compare import CompareError, load_sides
    from ..branch.registry import BadRecord
    from ..daemon.repair import repair_if_no_daemon
    try:
        repair_if_no_daemon(project)
        for rec in registry.forks(project):
            if rec["dir"] and str(rec["id"]) in ids and os.path.isdir(rec["dir"]):
                repair_if_no_daemon(Project(rec["dir"]))
        return load_sides(project, ids)
    except (CompareError, BadRecord) as e:
        raise Usage(str(e)) from None


def run_in_each(sides, cmd) -> list[dict]:
    """CMD in every side with a working tree, all at once, each as a step there (`envgit run`);
    its exit code, time and last line of output."""
    results: list[dict] = [{"name": s.name, "exit_code": None, "seconds": None, "last_line": "",
                            "ran": s.root is not None} for s in sides]

    def one(i, side):
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "envgit", "run", "--", "sh", "-c", cmd], cwd=side.root,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines = [x for x in p.stdout.decode("utf-8", "replace").splitlines() if x.strip()]
        results[i].update(exit_code=p.returncode, seconds=round(time.monotonic() - t0, 2),
                          last_line=lines[-1][:200] if lines else "")
    threads = [threading.Thread(target=one, args=(i, s)) for i, s in enumerate(sides) if s.root]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _print(summaries, files, runs, cmd) -> None:
    names = [s["name"] for s in summaries]
    w = max(12, *(len(n) + 2 for n in names))

    def row(label, cells):
        print(f"{label:<18}" + "".join(f"{inert(str(c)):<{w}}" for c in cells))
    points = sorted({s["from_step"] for s in summaries if s["from_step"] is not None})
    print(f"# compare {' '.join(names)}" + (f" (forked at step {', '.join(map(str, points))})" if points else ""))
    row("", names)
    row("kind", [s["kind"] for s in summaries])
    row("steps", [s["steps"] for s in summaries])
    row("failed", [s["failed"] for s in summaries])
    row("requests", [s["requests"] for s in summaries])
    row("denied", [s["denied"] for s in summaries])
    row("asked", [s["asked"] for s in summaries])
    marks = sorted({m for s in summaries for m in s["marks"]})
    for m in marks:
        row(m[:17], [s["marks"].get(m, "-") for s in summaries])
    row("files changed", [s["files_changed"] for s in summaries])
    if runs is not None:
        print(f"# --run {inert(cmd)}")
        row("exit", [r["exit_code"] if r["ran"] else "(no tree)" for r in runs])
        row("seconds", [r["seconds"] if r["ran"] else "" for r in runs])
        for r in runs:
            if r["ran"]:
                print(f"  {inert(r['name'])}: {inert(r['last_line'])}")
    print("# files changed since the fork point (A/M/D/T; a letter per distinct content, "
          "the same letter: the same bytes)")
    if not files:
        print("  (none)")
    for f in files:
        cells = [f"{c['status']}:{c['content']}" if c["status"] else "-" for c in f["sides"]]
        print("  " + "".join(f"{c:<{w}}" for c in cells) + inert(f["path"]) + ("" if not f["same"] else "  (same)"))
