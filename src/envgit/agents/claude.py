"""`envgit claude [claude args…]`: Claude Code with every Bash tool call a step and every file
edit recorded, envgit's settings added with `--settings` (the user's own settings, the
project's .claude/ and CLAUDE.md all still apply; no file of theirs is edited).

  CLAUDE_CODE_SHELL_PREFIX  a generated one-word executable that runs claude_shim.py: each Bash
                            call becomes `envgit run -- bash -c <the model's command>`, a step in
                            the sandbox under the network gate, with its tool-call id
  PreToolUse (every tool)   claude_hook.py pre: hands the tool_use_id to the shim, and denies a
                            Read/Write/Edit/Glob/Grep on a path the policy closes
  PostToolUse (Write|Edit|MultiEdit|NotebookEdit)
                            claude_hook.py post: a record-only step per edit, then a snapshot

Claude itself still runs on the host: running it inside the sandbox (so Read/Write/Edit are
under the mounts and its traffic under the proxy) needs the daemon's inner socket, through
which a shim inside one sandbox asks for a sibling one (bwrap does not nest). Until then its
in-process file tools are checked by the PreToolUse hook, not by the mounts.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

from .session import AgentError, agent_binary, announce, new_session, project_here, session_dir

EDIT_TOOLS = "Write|Edit|MultiEdit|NotebookEdit"


def hook_command(project, session, calls, event) -> str:
    return shlex.join([sys.executable, "-m", "envgit.agents.claude_hook", "--project", project.root,
                       "--session", session, "--calls", calls, event])


def write_shim(d: str, project, session: str, calls: str) -> str:
    """The prefix must be one word with no spaces (Claude quotes what comes before a ` -`)."""
    if any(c.isspace() for c in d):
        d = tempfile.mkdtemp(prefix="envgit-claude-")
    path = os.path.join(d, "envgit-claude-shell")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# written by envgit claude: every Bash tool call becomes an envgit step\n"
                f"exec {shlex.join([sys.executable, '-m', 'envgit.agents.claude_shim', '--project', project.root, '--session', session, '--calls', calls])} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def settings(pre: str, post: str) -> dict:
    return {"hooks": {
        "PreToolUse": [{"matcher": "*", "hooks": [{"type": "command", "command": pre, "timeout": 30}]}],
        "PostToolUse": [{"matcher": EDIT_TOOLS, "hooks": [{"type": "command", "command": post, "timeout": 60}]}]}}


def launch(argv: list[str]) -> int:
    try:
        project = project_here()
        claude = agent_binary("claude", "ENVGIT_CLAUDE_BIN", "@anthropic-ai/claude-code")
    except AgentError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    session = new_session("claude")
    d = session_dir(project, session)
    calls = os.path.join(d, "claude-current-call")
    pre, post = (hook_command(project, session, calls, e) for e in ("pre", "post"))
    settings_file = os.path.join(d, "claude-settings.json")
    with open(settings_file, "w") as f:
        json.dump(settings(pre, post), f, indent=2)
    env = {**os.environ, "ENVGIT_SESSION": session,
           "CLAUDE_CODE_SHELL_PREFIX": write_shim(d, project, session, calls),
           "ENVGIT_CLAUDE_HOOKS": "\n".join((pre, post))}
    announce("claude", session, "each Bash call a sandboxed step, edits recorded; Claude itself "
             "runs on the host until the daemon's inner socket lands")
    try:
        return subprocess.call([claude, "--settings", settings_file, *argv], env=env)
    except KeyboardInterrupt:
        return 130
