#!/usr/bin/env python3
"""CLAUDE_CODE_SHELL_PREFIX for `envgit claude`, run *inside* Claude's sandbox: Claude Code runs
every shell string through this, as `<prefix> '<composed string>'`.

Standalone (standard library only, no envgit import): envgit copies it, with claude_hook.py
and inner_shim.py, into a read-only directory bound into the sandbox (see claude.py).

Three kinds of string arrive here, told apart by their shape:
  a Bash tool call   `source <snapshot> … && eval '<cmd>' < /dev/null && pwd -P >| /tmp/claude-XXXX-cwd`
                     -> over the inner control socket, one step in a sibling sandbox, argv
                     ["bash", "-c", <cmd>] (the model's command, none of the boilerplate), on
                     this process's stdin/stdout/stderr, with the tool-call id envgit's
                     PreToolUse hook left in $ENVGIT_CLAUDE_CALLS; then the cwd file gets the
                     directory the step started in
  envgit's own hook  (its exact command line, in $ENVGIT_CLAUDE_HOOKS) -> run as is
  anything else      the user's hooks, stdio MCP servers, status lines -> run as is, inside
                     Claude's sandbox, as Claude would without envgit
"""

import os
import re
import shlex
import sys

# The tail Claude Code 2.1 appends to a Bash tool command.
BASH_CALL = re.compile(r" && eval (?P<cmd>.+?) < /dev/null && pwd -P >\| (?P<cwdfile>/tmp/claude-[0-9a-z]+-cwd)\Z", re.S)


def model_command(composed: str):
    """(the model's command, Claude's cwd file) of a Bash tool call, or None for anything else."""
    m = BASH_CALL.search(composed)
    if not m:
        return None
    try:
        words = shlex.split(m.group("cmd"))
    except ValueError:
        return None
    return " ".join(words), m.group("cwdfile")      # what `eval` runs: its words, space-joined


def current_call():
    try:
        with open(os.environ.get("ENVGIT_CLAUDE_CALLS", "")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("envgit claude shim: expected one shell string", file=sys.stderr)
        return 2
    composed = argv[0]
    ours = os.environ.get("ENVGIT_CLAUDE_HOOKS", "").split("\n")
    call = None if composed in ours else model_command(composed)
    if call is None:
        os.execv("/bin/sh", ["/bin/sh", "-c", composed])
    cmd, cwd_file = call
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import inner_shim
    start = os.getcwd()
    try:
        return inner_shim.exit_code(["bash", "-c", cmd], tool_call_id=current_call())
    finally:
        # cd inside a step does not outlive it: Claude stays where the command started.
        try:
            with open(cwd_file, "w") as f:
                f.write(start + "\n")
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
