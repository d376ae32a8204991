"""`envgit copilot [copilot args…]`: GitHub Copilot CLI with its tool calls routed through
envgit as far as its hooks allow. Recorded and routed, not enforced like codex and claude:
Copilot has no seam that hands its tools to another program, so

  bash          preToolUse rewrites the command (`modifiedArgs`) into `envgit run -- bash -c CMD`:
                it runs in the sandbox as a step, under the network gate
  view, create, edit, glob, grep
                run inside Copilot's own process, unsandboxed; preToolUse refuses a path the
                policy closes (a read deny, a write outside the project), judged as the host
                opens it (symlinks followed; the host's /tmp is not a step's), and postToolUse
                records each create/edit as a record-only step (a snapshot follows it)
  anything else (MCP servers, web fetches of Copilot's own) is neither routed nor recorded.

The hooks come as a plugin in a generated directory (`--plugin-dir`): the user's
~/.copilot and the repository's .github/hooks are not touched. Copilot runs on the host with the
person's own ~/.copilot, so what it remembers (trusted folders, its sessions) carries from one
session to the next as without envgit; a step sees no ~/.copilot, and .github/hooks and
.mcp.json in the project are protected escape routes.
"""

import json
import os
import shlex
import sys

from ..run import FAILED
from .session import (
    AgentError,
    agent_binary,
    announce,
    new_session,
    project_here,
    run_on_terminal,
    say_escape_routes,
    session_dir,
)


def build_plugin(project, session: str) -> str:
    d = os.path.join(session_dir(project, session), "copilot-plugin")
    os.makedirs(d, exist_ok=True)
    # -P: copilot runs hooks in the project, which `-m` would put first on sys.path
    hook = [sys.executable, "-P", "-m", "envgit.agents.copilot_hook", "--project", project.root, "--session", session]

    def cmd(event):
        return shlex.join([*hook, event])
    with open(os.path.join(d, "plugin.json"), "w") as f:
        json.dump({"name": "envgit", "version": "0.1.0", "hooks": "hooks.json",
                   "description": "every bash call an envgit step; edits recorded"}, f, indent=2)
    with open(os.path.join(d, "hooks.json"), "w") as f:
        json.dump({"version": 1, "hooks": {
            "preToolUse": [{"type": "command", "bash": cmd("pre"), "timeoutSec": 30}],
            "postToolUse": [{"type": "command", "bash": cmd("post"), "timeoutSec": 60}]}}, f, indent=2)
    return d


def launch(argv: list[str]) -> int:
    try:
        project = project_here()
        copilot = agent_binary("copilot", "ENVGIT_COPILOT_BIN", "@github/copilot")
    except AgentError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return FAILED               # envgit's own failure, as `envgit run` says it
    session = new_session("copilot")
    plugin = build_plugin(project, session)
    announce("copilot", session, "recorded and routed through hooks, not enforced: "
             "its file tools run in its own process")
    try:
        return run_on_terminal([copilot, "--plugin-dir", plugin, *argv], {**os.environ, "ENVGIT_SESSION": session})
    finally:
        say_escape_routes(project, session)
