"""Claude Code's PreToolUse/PostToolUse hook under `envgit claude` (settings in claude.py).

    python -m envgit.agents.claude_hook --project ROOT --session S --calls FILE pre|post

pre:  every tool: the tool_use_id goes to FILE, where the shell shim picks it up for the step
      of a Bash call; a file tool (Read, Write, Edit, MultiEdit, NotebookEdit, Glob, Grep) on a
      path the policy closes is denied before it runs
post: Write|Edit|MultiEdit|NotebookEdit: a record-only step for the edit, with its tool-call
      id, so the daemon snapshots the tree after it"""

import argparse
import json
import os
import sys

from ..paths import Project

WRITES = ("Write", "Edit", "MultiEdit", "NotebookEdit")
READS = ("Read", "Glob", "Grep")


def tool_path(tool_input: dict) -> str | None:
    for key in ("file_path", "notebook_path", "path"):
        if isinstance(tool_input.get(key), str) and tool_input[key]:
            return tool_input[key]
    return None


def pre(project, calls_file, event) -> dict | None:
    call = event.get("tool_use_id")
    if call and calls_file:
        tmp = f"{calls_file}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(call)
        os.replace(tmp, calls_file)
    tool, path = event.get("tool_name"), tool_path(event.get("tool_input") or {})
    if tool in READS + WRITES and path:
        from .pathcheck import closed_path
        why = closed_path(project, path, event.get("cwd") or project.root, tool in WRITES)
        if why:
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                           "permissionDecisionReason": why}}
    return None


def post(project, session, event):
    tool = event.get("tool_name")
    if tool not in WRITES:
        return
    from .record import record_step
    path = os.path.normpath(os.path.join(event.get("cwd") or project.root,
                                         tool_path(event.get("tool_input") or {}) or ""))
    record_step(project, [f"claude:{tool}", path], session, event.get("tool_use_id"),
                {"tool": tool, "path": path, "claude_session": event.get("session_id")},
                marks=["agent-edit"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m envgit.agents.claude_hook")
    p.add_argument("--project", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("--calls", required=True)
    p.add_argument("event", choices=("pre", "post"))
    a = p.parse_args(argv)
    try:
        event = json.load(sys.stdin)
    except ValueError:
        return 0
    project = Project(a.project)
    if a.event == "pre":
        out = pre(project, a.calls, event)
        if out:
            print(json.dumps(out))
    else:
        post(project, a.session, event)
    return 0


if __name__ == "__main__":
    sys.exit(main())
