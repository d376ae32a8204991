#!/usr/bin/env python3
"""Claude Code's PreToolUse/PostToolUse hook under `envgit claude`, run inside Claude's sandbox
(settings in claude.py). Standalone: standard library only, copied beside inner_shim.py.

    claude_hook.py pre|post     (the hook event on stdin)

pre:  Bash: the tool_use_id goes to $ENVGIT_CLAUDE_CALLS/<digest of the command>.<n>, where
      the shell-prefix shim running that command takes it for the Bash call's step (one file
      per call: parallel calls keep their own ids)
post: Write|Edit|MultiEdit|NotebookEdit: over the inner control socket, a record-only step for
      the edit, with its tool-call id and the snapshot after it (the edit itself already
      happened inside the sandbox, under its mounts)"""

import json
import os
import socket
import sys
import time

WRITES = ("Write", "Edit", "MultiEdit", "NotebookEdit")


def tool_path(tool_input: dict):
    for key in ("file_path", "notebook_path", "path"):
        if isinstance(tool_input.get(key), str) and tool_input[key]:
            return tool_input[key]
    return None


def pre(event):
    call, calls = event.get("tool_use_id"), os.environ.get("ENVGIT_CLAUDE_CALLS")
    command = (event.get("tool_input") or {}).get("command")
    if not (call and calls and isinstance(command, str)):
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from atomicfile import write_atomic  # type: ignore[import-not-found]  # copied beside this script (claude.py)
    from claude_shim import call_key  # type: ignore[import-not-found]
    # The directory is writable by Claude's own tools: no name there is trusted (atomicfile.py).
    write_atomic(os.path.join(calls, f"{call_key(command)}.{time.time_ns()}"), call, sync=False)


def request(msg: dict) -> dict:
    """One frame over the inner socket (inner_shim.py's framing, no fds)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from inner_shim import frame, reply  # type: ignore[import-not-found]  # beside this script
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ.get("ENVGIT_INNER_SOCKET", "/run/envgit/control.sock"))
        s.sendall(frame(msg))
        return reply(s)


def post(event):
    tool = event.get("tool_name")
    if tool not in WRITES:
        return
    cwd = event.get("cwd") or os.getcwd()
    path = os.path.normpath(os.path.join(cwd, tool_path(event.get("tool_input") or {}) or ""))
    try:
        reply = request({"op": "record", "argv": [f"claude:{tool}", path], "cwd": cwd,
                         "tool_call_id": event.get("tool_use_id"), "marks": ["agent-edit"],
                         "body": {"tool": tool, "path": path, "claude_session": event.get("session_id")}})
    except (OSError, EOFError) as e:
        reply = {"error": str(e)}
    if "error" in reply:
        print(f"envgit: could not record {tool} {path}: {reply['error']}", file=sys.stderr)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["pre"], ["post"]):
        print("usage: claude_hook.py pre|post", file=sys.stderr)
        return 2
    try:
        event = json.load(sys.stdin)
    except ValueError:
        return 0
    (pre if argv[0] == "pre" else post)(event)
    return 0


if __name__ == "__main__":
    sys.exit(main())
