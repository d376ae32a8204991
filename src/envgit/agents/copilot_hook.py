"""Copilot CLI's preToolUse/postToolUse hook under `envgit copilot` (see copilot.py).

    python -m envgit.agents.copilot_hook --project ROOT --session S pre|post   (event JSON on stdin)

pre:  bash -> {"modifiedArgs": {…, "command": "ENVGIT_SESSION=S envgit run -- bash -c CMD"}}
      a file tool on a path the policy closes -> {"permissionDecision": "deny", …}
post: create/edit -> a record-only step
Prints nothing (Copilot goes on as it would) for everything else."""

import argparse
import json
import os
import shlex
import sys

from ..paths import Project
from .pathcheck import closed_path
from .session import envgit_exe

READS = ("view", "glob", "grep")
WRITES = ("create", "edit")


def routed(cmd: str, session: str) -> str:
    return f"ENVGIT_SESSION={shlex.quote(session)} {shlex.quote(envgit_exe())} run -- bash -c {shlex.quote(cmd)}"


def pre(project, session, event) -> dict | None:
    tool, args = event.get("toolName"), event.get("toolArgs") or {}
    if tool == "bash" and isinstance(args.get("command"), str):
        # modifiedArgs replaces the arguments whole: keep the others (description, mode…)
        return {"permissionDecision": "allow",
                "modifiedArgs": {**args, "command": routed(args["command"], session)}}
    if tool in READS + WRITES and isinstance(args.get("path"), str):
        why = closed_path(project, args["path"], event.get("cwd") or project.root, tool in WRITES)
        if why:
            return {"permissionDecision": "deny", "permissionDecisionReason": why}
    return None


def post(project, session, event):
    tool, args = event.get("toolName"), event.get("toolArgs") or {}
    if tool not in WRITES:
        return
    from .record import record_step
    result = event.get("toolResult") or {}
    ok = result.get("resultType") == "success"
    path = os.path.normpath(os.path.join(event.get("cwd") or project.root, str(args.get("path", ""))))
    record_step(project, [f"copilot:{tool}", path], session, None,
                {"tool": tool, "path": path, "result": result.get("resultType"),
                 "copilot_session": event.get("sessionId")},
                exit_code=0 if ok else 1, marks=["agent-edit"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m envgit.agents.copilot_hook")
    p.add_argument("--project", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("event", choices=("pre", "post"))
    a = p.parse_args(argv)
    try:
        event = json.load(sys.stdin)
    except ValueError:
        return 0
    project = Project(a.project)
    if a.event == "pre":
        out = pre(project, a.session, event)
        if out:
            print(json.dumps(out))
    else:
        post(project, a.session, event)
    return 0


if __name__ == "__main__":
    sys.exit(main())
