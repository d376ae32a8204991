"""Codex's PreToolUse hook under `envgit codex`: write the running tool call's id where the
exec-server reads it, so the fs/* steps of an apply_patch carry the id of their tool call
(Codex sends the id with process/start, but not with file operations).

    python -m envgit.agents.codex_hook CALLS_FILE      (hook input JSON on stdin)

It never blocks a tool: its output is empty and its exit status 0."""

import json
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        event = json.load(sys.stdin)
    except ValueError:
        return 0
    call = event.get("tool_use_id") if isinstance(event, dict) else None
    if call and len(argv) == 1:
        from ..atomicfile import write_atomic
        write_atomic(argv[0], str(call), sync=False)    # the exec-server never reads half an id
    return 0


if __name__ == "__main__":
    sys.exit(main())
