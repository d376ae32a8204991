"""`envgit claude [claude args…]`: Claude Code itself runs inside envgit's sandbox, so its own
Read/Write/Edit tools meet the same read denies and write scope as any step, and all of its
traffic (the model API included) goes through the network gate, recorded on the session's step.

  the session step   a record-only step `claude …` open for the whole session: Claude's own
                     requests are recorded on it, and its end carries the last snapshot
  the sandbox        the daemon's `spec` with the inner control socket bound in, the Claude
                     binary's directory and a generated directory of stdlib-only scripts
                     read-only, Claude's state (~/.claude, ~/.claude.json) read-only but for
                     the directories Claude writes during a session (CLAUDE_WRITABLE)
  CLAUDE_CONFIG_DIR  claude_config.py: a directory of Claude's own per project, where its
                     .claude.json (onboarding, theme, trusted folders) is writable and
                     persists between sessions, linking to ~/.claude's entries
  CLAUDE_CODE_SHELL_PREFIX
                     claude_shim.py: each Bash call is sent over the inner socket and runs as
                     a step of its own in a sibling sandbox, argv ["bash", "-c", <the model's
                     command>], with its tool-call id
  PreToolUse (Bash)  claude_hook.py pre: leaves the tool_use_id where the shim reads it
  PostToolUse (Write|Edit|MultiEdit|NotebookEdit)
                     claude_hook.py post: a record-only step per edit, with its snapshot

envgit's settings are added with `--settings`: the user's own settings, the project's
.claude/ and CLAUDE.md all still apply, and no file of theirs is edited.
"""

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from urllib.parse import urlsplit

from . import hostoffer, learnmode
from .claude_shim import envgit_mcp
from .session import AgentError, agent_binary, announce, new_session, newest_conversation, project_here, say_resume

EDIT_TOOLS = "Write|Edit|MultiEdit|NotebookEdit"
HERE = os.path.dirname(os.path.abspath(__file__))
INNER_SHIM = os.path.join(os.path.dirname(HERE), "daemon", "inner_shim.py")
ATOMICFILE = os.path.join(os.path.dirname(HERE), "atomicfile.py")    # claude_hook.py writes with it

# The user's variables Claude Code itself reads (credentials, endpoint, model, its switches):
# a policy's env.pass is for steps, these are for the agent's own process only.
CLAUDE_VARS = ("ANTHROPIC_", "CLAUDE_", "DISABLE_", "MAX_THINKING_TOKENS", "BASH_DEFAULT_TIMEOUT_MS",
               "BASH_MAX_TIMEOUT_MS", "MCP_TIMEOUT", "MCP_TOOL_TIMEOUT", "MCP_CONNECT_TIMEOUT_MS",
               "MCP_CONNECTION_NONBLOCKING", "MAX_MCP_OUTPUT_TOKENS", "ENABLE_TOOL_SEARCH", "AWS_BEARER_TOKEN_BEDROCK")


def python_inside() -> tuple[str, list[str]]:
    """An interpreter for the scripts inside the sandbox, and what must be bound for it."""
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3", []
    return os.path.realpath(sys.executable), [sys.base_prefix]


def package_dir(binary: str) -> str:
    """What Claude needs visible: its npm package (the native binary sits in bin/), else the
    binary's own directory."""
    real = os.path.realpath(binary)
    d = os.path.dirname(real)
    if os.path.basename(d) == "bin" and os.path.exists(os.path.join(d, "..", "package.json")):
        return os.path.dirname(d)
    return d


def write_scripts(python: str) -> tuple[str, str, str]:
    """(the generated dir, its read-only bin/, its writable state/). The prefix must be one
    word with no spaces (Claude quotes what comes before a ` -`), hence a fresh /tmp dir."""
    top = tempfile.mkdtemp(prefix="envgit-claude-", dir="/tmp")
    bin_dir, state = os.path.join(top, "bin"), os.path.join(top, "state")
    os.mkdir(bin_dir)
    os.mkdir(state)
    for src in (os.path.join(HERE, "claude_shim.py"), os.path.join(HERE, "claude_hook.py"), INNER_SHIM,
                ATOMICFILE):
        with open(src) as f:
            body = f.read()
        if body.startswith("#!"):
            body = body.split("\n", 1)[1]
        dst = os.path.join(bin_dir, os.path.basename(src))
        with open(dst, "w") as f:
            f.write(f"#!{python} -I\n" + body)
        os.chmod(dst, 0o555)
    return top, bin_dir, state


def settings(hook_pre: str, hook_post: str, project_root: str | None = None) -> dict:
    """envgit's --settings: its hooks, and the approval of the project's `.mcp.json` entries
    that start envgit's own MCP server (the shim hands those to the daemon, whatever else the
    entry says, so approving them runs nothing of the entry's): Claude would otherwise ask,
    and fail to save the answer in `.claude/settings.local.json`, read-only inside."""
    out: dict = {"hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": hook_pre, "timeout": 30}]}],
        "PostToolUse": [{"matcher": EDIT_TOOLS, "hooks": [{"type": "command", "command": hook_post,
                                                          "timeout": 60}]}]}}
    ours = envgit_mcp_servers(project_root) if project_root else []
    if ours:
        out["enabledMcpjsonServers"] = ours
    return out


def envgit_mcp_servers(project_root: str) -> list[str]:
    """The names of the project's `.mcp.json` stdio servers that are `envgit mcp`."""
    try:
        with open(os.path.join(project_root, ".mcp.json"), encoding="utf-8") as f:
            servers = json.load(f).get("mcpServers") or {}
    except (OSError, ValueError, AttributeError):
        return []
    names = []
    for name, entry in servers.items() if isinstance(servers, dict) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
            continue
        args = entry.get("args") or []
        if isinstance(args, list) and all(isinstance(a, str) for a in args) and \
                envgit_mcp(shlex.join([entry["command"], *args])) is not None:
            names.append(name)
    return sorted(names)


# In ~/.claude, the only paths writable inside: what Claude Code writes for a session to work
# (seen with its own tests and its binary's strings, 2.1.x), none of which it reads as settings,
# hooks, commands, MCP servers or a program to run. Everything else there stays read-only:
# settings*.json, .config.json and .mcp.json (MCP servers: run the next time Claude starts,
# outside envgit too), CLAUDE.md, hooks/ commands/ agents/ plugins/ skills/ rules/
# output-styles/ workflows/ monitors/, local/ (a local install of Claude itself), ide/ (which
# IDE to connect to), backups/ (what ~/.claude.json is restored from), and any name a later
# Claude Code adds: read-only unless named here.
CLAUDE_WRITABLE = (
    "projects",         # the session transcripts (-p writes them too; --resume reads them)
    "sessions",         # the running sessions' records, made at start
    "session-env",      # a session's environment for its Bash calls, made at start
    "shell-snapshots",  # the user's shell functions/aliases, sourced before each Bash call
    "todos",            # TodoWrite's lists
    "file-history",     # the edits' checkpoints (/rewind)
    "plans",            # plan mode's plans
    "debug",            # --debug's logs
    "statsig",          # feature-flag cache
    "paste-cache", "image-cache",   # pasted text and images of interactive sessions
)


def persons_state(home: str, environ=os.environ) -> tuple[str, str]:
    """(the person's Claude directory, their .claude.json): ~/.claude and ~/.claude.json, or
    $CLAUDE_CONFIG_DIR and the .claude.json in it when they set one, as Claude itself reads."""
    own = environ.get("CLAUDE_CONFIG_DIR") or ""
    if os.path.isabs(own):
        return os.path.normpath(own), os.path.join(os.path.normpath(own), ".claude.json")
    return os.path.join(home, ".claude"), os.path.join(home, ".claude.json")


def claude_state(home: str) -> tuple[list[str], list[str]]:
    """(read, write) for Claude's own state: ~/.claude and ~/.claude.json read-only
    (Claude rewrites the latter through a temporary file beside it, in the home directory,
    which is read-only inside), the CLAUDE_WRITABLE directories of ~/.claude writable, created
    when absent (a bind needs something to bind, and none could be created inside). One that
    is a symlink stays read-only: binding it would make its target writable."""
    d, cfg = persons_state(home)
    os.makedirs(d, exist_ok=True)
    write = []
    for name in CLAUDE_WRITABLE:
        path = os.path.join(d, name)
        if os.path.islink(path):
            continue
        os.makedirs(path, exist_ok=True)
        write.append(path)
    return [d, cfg], write


def own_config(project, home: str) -> str | None:
    """Claude's config directory for this project (claude_config.py), laid out for a launch;
    None (Claude keeps the read-only ~/.claude.json, and asks its start-up questions again)
    when there is no place for it."""
    from ..sandbox.environ import project_cache
    from .claude_config import config_dir, prepare
    cfg = config_dir(project_cache(project.root, project.state))
    if cfg is None:
        return None
    try:
        prepare(cfg, *persons_state(home))
    except OSError as e:
        print(f"envgit: Claude's state will not persist this session: {cfg}: {e}", file=sys.stderr)
        return None
    return cfg


def model_endpoint(env: dict) -> tuple[str, int]:
    u = urlsplit(env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com")
    return u.hostname or "", u.port or (80 if u.scheme == "http" else 443)


# Claude Code's first launch (its onboarding not done in the config it runs with) checks it
# can reach these, whatever ANTHROPIC_BASE_URL says, and exits when it cannot (its binary's
# preflight: BASE_API_URL + /api/hello, TOKEN_URL's origin + /v1/oauth/hello); not with a
# gateway's ANTHROPIC_AUTH_TOKEN, Bedrock or Vertex, which skip it.
FIRST_LAUNCH_CHECK = ("api.anthropic.com", "platform.claude.com")


def needs(env, config_dir: str | None, home: str) -> list[tuple[str, int, str]]:
    """(host, port, why) of what Claude reaches before it can work: its model API, and on a
    first launch its connectivity check's hosts."""
    host, port = model_endpoint(env)
    out = [(host, port, "its model API")]
    if not _onboarded(config_dir, home) and not any(env.get(k) for k in (
            "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX")):
        out += [(h, 443, "the connectivity check of Claude's first launch") for h in FIRST_LAUNCH_CHECK
                if (h, 443) != (host, port)]
    return out


def _onboarded(config_dir, home) -> bool:
    path = os.path.join(config_dir, ".claude.json") if config_dir else persons_state(home)[1]
    try:
        with open(path) as f:
            return json.load(f).get("hasCompletedOnboarding") is True
    except (OSError, ValueError, AttributeError):
        return False


def launch(argv: list[str], learn: bool = False) -> int:
    from ..daemon.client import DaemonError, connect
    from ..run import execute
    from ..sandbox.launch import LaunchError, bwrap_path
    try:
        project = project_here()
        claude = agent_binary("claude", "ENVGIT_CLAUDE_BIN", "@anthropic-ai/claude-code")
        bwrap_path(project.root)
    except (AgentError, LaunchError) as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    session = new_session("claude")
    home = os.path.expanduser("~")
    python, python_dirs = python_inside()
    top, bin_dir, state = write_scripts(python)
    calls = os.path.join(state, "calls")
    os.mkdir(calls)
    try:
        hook = os.path.join(bin_dir, "claude_hook.py")
        pre, post = f"{hook} pre", f"{hook} post"
        settings_file = os.path.join(bin_dir, "settings.json")
        with open(settings_file, "w") as f:
            json.dump(settings(pre, post, project.root), f, indent=2)
        set_env = {k: v for k, v in os.environ.items() if k.startswith(CLAUDE_VARS)}
        # ENVGIT_CLAUDE_CALLS (a directory: one file per Bash call, claude_hook.py) stays
        # writable inside Claude's sandbox, so Claude's own Write tool could put an id there:
        # the PreToolUse hook that must write it runs in that sandbox, as Claude's child, under
        # the same mounts (a mount cannot tell the two apart). What bounds it: the hook writes
        # each call's id right before the call, the model's Bash steps run in
        # sibling sandboxes without this directory, and a tool_call_id sent from inside is the
        # agent's label on a step (recorded with origin "inner"), never an authority.
        set_env.update({"CLAUDE_CODE_SHELL_PREFIX": os.path.join(bin_dir, "claude_shim.py"),
                        "ENVGIT_CLAUDE_HOOKS": "\n".join((pre, post)),
                        "ENVGIT_CLAUDE_CALLS": calls})
        if os.geteuid() == 0:
            set_env["IS_SANDBOX"] = "1"     # as root, --dangerously-skip-permissions asks for it
        cwd = os.path.realpath(os.getcwd())
        state_read, state_write = claude_state(home)
        own = own_config(project, home)
        if own:
            set_env["CLAUDE_CONFIG_DIR"] = own
            state_write.append(own)
        hostoffer.offer(project, "Claude", needs(os.environ, own, home))
        try:
            conn = connect(project)
            conn.request({"op": "baseline"})
            if learn:                   # before its first step: the whole session (learnmode.py)
                said = conn.request({"op": "learn", "action": "on", "session": session})
                if "error" in said:
                    print(said["error"], file=sys.stderr)
                    return 2
                learnmode.announce("Claude")
            began = conn.request({"op": "begin", "record_only": True, "argv": ["claude", *argv], "cwd": cwd,
                                  "env": {}, "pid": os.getpid(), "uid": os.getuid(), "session": session,
                                  "marks": ["agent-session"]})
            if "step" not in began:
                raise DaemonError(began.get("error") or began.get("refused") or "no step")
            step = began["step"]
            spec = conn.request({"op": "spec", "argv": [os.path.realpath(claude), "--settings", settings_file,
                                                        *argv],
                                 "cwd": cwd, "env": dict(os.environ), "session": session, "step": step,
                                 "inner": True, "read": [package_dir(claude), bin_dir, *python_dirs, *state_read],
                                 "write": [*state_write, state],
                                 "set_env": set_env})
            if "error" in spec:
                conn.request({"op": "end", "step": step, "exit_code": 125, "signal": None, "duration_ms": 0})
                raise DaemonError(spec["error"])
        except (DaemonError, OSError) as e:
            print(f"envgit: {e}", file=sys.stderr)
            return 1
        announce("claude", session, "Claude runs in the sandbox: its file tools under the mounts, its "
                 "traffic through the gate, each Bash call a step")
        # bind: Claude's own traffic goes through the gate on `step`, tied to its sandbox
        # hold_notices: the gate's notices (a host Claude tried) are said after Claude's
        # full-screen UI has exited, not drawn over it
        started = time.time()
        code, _ = execute(conn, step, spec["bwrap"], spec["env"], spec.get("bind"), project.root,
                          hold_notices=True)
        if learn:
            learnmode.switch(project, session, on=False)
        conversation = newest_conversation([(own or state_read[0], "projects/*/*.jsonl")], started)
        say_resume(f"envgit claude --resume {conversation}" if conversation else None)
        return code
    finally:
        shutil.rmtree(top, ignore_errors=True)
