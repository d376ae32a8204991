"""`envgit claude|codex --fork N ARGS…`: the agent, non-interactively, in N fresh branches of
the project at once (one per branch, each its own envgit session), then the branches side by
side (`envgit compare`).

Each run is the plain adapter (`envgit AGENT ARGS…`) started in its branch's directory, so what
holds for one session holds for each: its steps are its branch's, its pushes judged by the
gate there. Their output goes to a log per branch (interleaved output of N agents would be
unreadable), under the main project's `.envgit/agents/fork-<time>/<id>.log`; what each run
ended with is said as it ends.
"""

import os
import subprocess
import sys
import threading
import time

# What makes each agent run without its full-screen UI: N UIs cannot share one terminal.
PRINT_MODE = {"claude": ("-p", "--print"), "codex": ("exec", "e")}


class ForkError(Exception):
    """Said as one line; nothing was started."""


def split_fork(argv: list[str]) -> tuple[int | None, list[str]]:
    """(N, the agent's own arguments) for `--fork N ARGS…` / `--fork=N ARGS…`; (None, argv)
    without it."""
    if argv[:1] == ["--fork"] and len(argv) >= 2:
        n, rest = argv[1], argv[2:]
    elif argv[:1] and argv[0].startswith("--fork="):
        n, rest = argv[0].split("=", 1)[1], argv[1:]
    elif argv[:1] == ["--fork"]:
        raise ForkError("--fork needs a number of branches: `--fork 3`")
    else:
        return None, argv
    if not n.isdigit() or not 1 <= int(n) <= 16:
        raise ForkError(f"--fork {n}: give a number of branches from 1 to 16")
    return int(n), rest


def split_worktree(argv: list[str]) -> tuple[bool, str | None, list[str]]:
    """(given, its name, the rest) for Claude's own `-w/--worktree [NAME]` anywhere before
    `--` (an optional value, as Claude reads it: the next word unless it starts with `-`)."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a.startswith("--worktree="):
            return True, a.split("=", 1)[1] or None, argv[:i] + argv[i + 1:]
        if a in ("-w", "--worktree"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            name = nxt if nxt is not None and not nxt.startswith("-") else None
            return True, name, argv[:i] + argv[i + 1 + (name is not None):]
    return False, None, argv


def new_branch(agent: str, name: str | None) -> str:
    """`envgit claude --worktree [NAME]`: instead of the git worktree Claude would make (files
    git tracks, inside the project, under the project's own session), a new envgit branch of
    the project's last step (envgit fork 1): every file, the venv and ignored files too, its own
    `.git`, its own session and journal. Returns its directory; the session is then started
    there like any other."""
    import json

    from .session import project_here
    project = project_here()
    made = subprocess.run([sys.executable, "-m", "envgit", "fork", "1", "--json"], cwd=project.root,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if made.returncode != 0:
        raise ForkError((made.stderr.strip() or "envgit fork failed").removeprefix("envgit: "))
    [b] = json.loads(made.stdout)["branches"]
    print(f"envgit: {agent} --worktree{' ' + name if name else ''}: in branch {b['id']} of this "
          f"project, {b['dir']} (a fork of step {json.loads(made.stdout)['step']}; from {project.root}: "
          f"`envgit compare main {b['id']}`, `envgit adopt {b['id']}`)", file=sys.stderr, flush=True)
    return b["dir"]


def launch(agent: str, n: int, argv: list[str]) -> int:
    from ..branch import registry
    from .session import project_here
    if not any(a in PRINT_MODE.get(agent, ()) for a in argv[:1] + [a for a in argv if a.startswith("-")]):
        modes = " or ".join(PRINT_MODE.get(agent, ("a non-interactive mode",)))
        raise ForkError(f"--fork runs {agent} in {n} branches at once, without its terminal UI: "
                        f"give {modes} (e.g. `envgit {agent} --fork {n} {PRINT_MODE.get(agent, ('',))[0]} "
                        "\"fix the flaky test\"`)")
    project = project_here()
    before = {r["id"] for r in registry.forks(project)}
    made = subprocess.run([sys.executable, "-m", "envgit", "fork", str(n)], cwd=project.root,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if made.returncode != 0:
        sys.stderr.write(made.stderr)
        return made.returncode
    new = sorted((r for r in registry.forks(project) if r["id"] not in before), key=lambda r: r["id"])
    logs = project.state_path("agents", time.strftime("fork-%Y%m%d-%H%M%S"))
    os.makedirs(logs, exist_ok=True)
    print(f"envgit: {agent} in {len(new)} branches at once: "
          + ", ".join(f"{r['id']} ({r['dir']})" for r in new) + f"; their output: {logs}/", file=sys.stderr)
    codes: dict[int, int] = {}

    def one(rec):
        with open(os.path.join(logs, f"{rec['id']}.log"), "wb") as log:
            p = subprocess.run([sys.executable, "-m", "envgit", agent, *argv], cwd=rec["dir"],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        codes[rec["id"]] = p.returncode
        print(f"envgit: branch {rec['id']}: {agent} exited {p.returncode}", file=sys.stderr, flush=True)
    threads = [threading.Thread(target=one, args=(r,)) for r in new]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "envgit", "compare", "main", *(str(r["id"]) for r in new)],
                   cwd=project.root, stdin=subprocess.DEVNULL)
    print("envgit: `envgit adopt ID` makes one of them this tree; `envgit branch rm ID` drops one",
          file=sys.stderr)
    return max(codes.values(), default=0)
