"""Recording what an agent did in its own process (an edit by Claude's Write tool, Copilot's
`create`): a record-only step, so the daemon journals it and snapshots the tree after it."""

import os

from ..daemon.client import DaemonError, connect


def record_step(project, argv: list[str], session: str, tool_call_id: str | None, body: dict,
                exit_code: int = 0, marks=()) -> int | None:
    """The step id, or None when the daemon cannot be reached (said on stderr, never fatal:
    the agent's own work has already happened)."""
    try:
        conn = connect(project)
        try:
            r = conn.request({"op": "begin", "record_only": True, "argv": argv, "cwd": project.root,
                              "env": {}, "pid": os.getpid(), "uid": os.getuid(), "session": session,
                              "tool_call_id": tool_call_id, "marks": list(marks)})
            if "step" not in r:
                raise DaemonError(r.get("error") or r.get("refused") or "no step")
            conn.request({"op": "event", "step": r["step"], "kind": "file-op", "body": body})
            conn.request({"op": "end", "step": r["step"], "exit_code": exit_code, "signal": None,
                          "duration_ms": 0})
            return r["step"]
        finally:
            conn.close()
    except (DaemonError, OSError) as e:
        import sys
        print(f"envgit: could not record {' '.join(argv)}: {e}", file=sys.stderr)
        return None
