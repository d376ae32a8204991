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
                     PreToolUse hook left for this command in $ENVGIT_CLAUDE_CALLS; the step
                     itself writes its last directory to Claude's cwd file when <cmd>
                     succeeds (the daemon's cwd_file), so a `cd` holds in the next call, as in
                     Claude Code without envgit
  envgit's own hook  (its exact command line, in $ENVGIT_CLAUDE_HOOKS) -> run as is
  envgit's MCP server `envgit mcp [--project DIR]` (an MCP server entry of the person's, as
                     docs/MCP.md sets it up) -> over the inner control socket, run by the daemon
                     on the host on this process's stdin/stdout/stderr: inside, envgit's state
                     is read-only and its upstream servers would lose the person's tokens
  anything else      the user's hooks, stdio MCP servers, status lines -> run as is, inside
                     Claude's sandbox, as Claude would without envgit
"""

import hashlib
import os
import re
import shlex
import sys

# The tail Claude Code 2.1 appends to a Bash tool command.
BASH_CALL = re.compile(r" && eval (?P<cmd>.+?) < /dev/null && pwd -P >\| (?P<cwdfile>/tmp/claude-[0-9a-z]+-cwd)\Z",
                       re.S)


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


def envgit_mcp(composed: str):
    """The `--project` of an `envgit mcp` server's command line (`envgit mcp`, a path to envgit,
    or `python -m envgit`), "" without one; None for any other string (`--http` included:
    that server is the person's to run, outside)."""
    try:
        words = shlex.split(composed)
    except ValueError:
        return None
    if len(words) >= 3 and words[1:3] == ["-m", "envgit"] and os.path.basename(words[0]).startswith("python"):
        words = words[2:]
    if len(words) < 2 or os.path.basename(words[0]) != "envgit" or words[1] != "mcp":
        return None
    rest = words[2:]
    if not rest:
        return ""
    if len(rest) == 2 and rest[0] == "--project":
        return rest[1]
    if len(rest) == 1 and rest[0].startswith("--project="):
        return rest[0].split("=", 1)[1]
    return None


def call_key(command: str) -> str:
    """The name under which claude_hook.py leaves a Bash call's id: the command's digest, so
    that parallel calls (two tool_use blocks in one answer) each find their own."""
    return hashlib.sha256(command.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def take_call(command: str):
    """The tool-call id the PreToolUse hook left for `command` (taken: each id once), else the
    only one waiting (Claude may have reworded the command), else None."""
    d = os.environ.get("ENVGIT_CLAUDE_CALLS", "")
    try:
        waiting = sorted(n for n in os.listdir(d) if "." in n and not n.startswith("."))
    except OSError:
        return None
    # the newest first: an older one is a call that never ran (refused at its permission
    # question); two identical commands at once get one id each either way
    mine = sorted((n for n in waiting if n.split(".", 1)[0] == call_key(command)),
                  key=lambda n: int(n.split(".", 1)[1]) if n.split(".", 1)[1].isdigit() else 0, reverse=True)
    for name in mine or (waiting if len(waiting) == 1 else []):
        taken = os.path.join(d, f".taken.{os.getpid()}")
        try:
            os.rename(os.path.join(d, name), taken)     # atomic: a parallel shim gets the next one
        except OSError:
            continue
        try:
            with open(taken) as f:
                return f.read().strip() or None
        finally:
            os.unlink(taken)
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("envgit claude shim: expected one shell string", file=sys.stderr)
        return 2
    composed = argv[0]
    ours = os.environ.get("ENVGIT_CLAUDE_HOOKS", "").split("\n")
    call = None if composed in ours else model_command(composed)
    mcp = None if call is not None or composed in ours else envgit_mcp(composed)
    if call is None and mcp is None:
        os.execv("/bin/sh", ["/bin/sh", "-c", composed])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import inner_shim  # type: ignore[import-not-found]  # copied beside this script
    if call is None:
        return inner_shim.mcp_exit_code(mcp or None)
    cmd, cwd_file = call
    return inner_shim.exit_code(["bash", "-c", cmd], tool_call_id=take_call(cmd), cwd_file=cwd_file)


if __name__ == "__main__":
    sys.exit(main())
