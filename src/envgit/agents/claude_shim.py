"""CLAUDE_CODE_SHELL_PREFIX for `envgit claude`: Claude Code runs every shell string through
this, as `<prefix> '<composed string>'`. Standard library only: it runs once per command.

Three kinds of string arrive here, told apart by their shape:
  a Bash tool call   `source <snapshot> … && eval '<cmd>' < /dev/null && pwd -P >| /tmp/claude-XXXX-cwd`
                     -> one step, argv ["bash", "-c", <cmd>] (the model's command, none of the
                     boilerplate), with the tool-call id envgit's PreToolUse hook left for it;
                     then the cwd file gets the directory the step started in
  envgit's own hook  (its exact command line, handed over in ENVGIT_CLAUDE_HOOKS) -> run as is
  anything else      the user's hooks, stdio MCP servers, status lines -> run as is, as Claude
                     would without envgit

    python -m envgit.agents.claude_shim --project ROOT --session S --calls FILE '<string>'
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


def current_call(calls_file: str) -> str | None:
    try:
        with open(calls_file) as f:
            return f.read().strip() or None
    except OSError:
        return None


def run_as_is(composed: str) -> int:
    os.execv("/bin/sh", ["/bin/sh", "-c", composed])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = {}
    while len(argv) >= 2 and argv[0] in ("--project", "--session", "--calls"):
        opts[argv[0][2:]], argv = argv[1], argv[2:]
    if len(argv) != 1:
        print("envgit claude shim: expected one shell string", file=sys.stderr)
        return 2
    composed = argv[0]
    ours = os.environ.get("ENVGIT_CLAUDE_HOOKS", "").split("\n")
    call = None if composed in ours else model_command(composed)
    if call is None:
        return run_as_is(composed)
    cmd, cwd_file = call
    os.environ["ENVGIT_SESSION"] = opts.get("session", os.environ.get("ENVGIT_SESSION", ""))
    tool_call = current_call(opts.get("calls", ""))
    if tool_call:
        os.environ["ENVGIT_TOOL_CALL_ID"] = tool_call
    start = os.getcwd()
    from ..run import run
    try:
        code = run(["bash", "-c", cmd])
    finally:
        # cd inside a step does not outlive it: Claude stays where the command started.
        try:
            with open(cwd_file, "w") as f:
                f.write(start + "\n")
        except OSError:
            pass
    return code


if __name__ == "__main__":
    sys.exit(main())
