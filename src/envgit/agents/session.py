"""What every adapter needs: the project, one envgit session id per agent session, the
`envgit` executable the agent's commands are routed through, and the agent's binary."""

import os
import secrets
import shutil
import sys
import time

from ..paths import NoProject, find_project


class AgentError(Exception):
    """A reason the agent cannot be started, worded for the person at the terminal."""


def project_here():
    try:
        return find_project(os.getcwd())
    except NoProject as e:
        raise AgentError(str(e)) from None


def new_session(agent: str) -> str:
    """`codex-20261202-175601-3fa2`: sortable, and says which agent the steps came from."""
    return f"{agent}-" + time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def session_dir(project, session: str) -> str:
    """Where an adapter keeps its generated files (settings, overlays). Under .envgit/, so
    nothing in a sandbox can read or change them."""
    d = project.state_path("agents", session)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def envgit_exe() -> str:
    """The `envgit` next to this Python (the venv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "envgit")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("envgit")
    if not found:
        raise AgentError("cannot find the `envgit` executable to route the agent's commands through")
    return _outside_project(found, "envgit")      # not a step's own, from an activated .venv/bin


def agent_binary(name: str, env_var: str, package: str) -> str:
    """The agent's executable: $ENVGIT_<AGENT>_BIN, else `name` on PATH; never one inside the
    project, which any step can write (an activated .venv/bin or node_modules/.bin on PATH
    would otherwise have the next launch run a step's own `codex` outside the sandbox)."""
    explicit = os.environ.get(env_var)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise AgentError(f"{env_var}={explicit} is not an executable")
        return _outside_project(explicit, name)
    found = shutil.which(name)
    if not found:
        raise AgentError(f"`{name}` is not on PATH: install it with `npm install -g {package}` "
                         f"(or point {env_var} at it)")
    return _outside_project(found, name)


def _outside_project(path: str, name: str) -> str:
    try:
        root = find_project(os.getcwd()).root
    except NoProject:
        return path
    # the name as found too: a symlink in the project (`.venv/bin/codex -> /usr/bin/python3`)
    # is the step's choice of what runs, whatever it points at today
    if any(p == root or p.startswith(root + "/") for p in (os.path.realpath(path), os.path.abspath(path))):
        raise AgentError(f"the `{name}` found ({path}) is inside the project {root}, where a step "
                         f"can replace it; install {name} outside the project (npm install -g), or "
                         "deactivate the project's environment before starting the agent")
    return path


def run_on_terminal(cmd: list[str], env: dict) -> int:
    """Run an agent that runs on the host (Codex, Copilot) on this terminal, as its shell would:
    in our process group, so its own Ctrl-C/Ctrl-Z handling and the shell's job control are
    what they are without envgit. While it runs this process ignores SIGINT/SIGQUIT/SIGHUP (the
    agent decides what they mean; we wait to tidy up after it) and passes SIGTERM on. The
    terminal's modes are saved before and restored after, however the agent ended (kill -9
    leaves raw mode and the alternate screen behind). Returns the shell's exit status."""
    import signal
    import subprocess
    tty = _terminal_modes()
    p = subprocess.Popen(cmd, env=env)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)}
    old[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda *_: p.send_signal(signal.SIGTERM))
    try:
        code = p.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if tty:
            _restore_terminal(*tty, died=p.returncode is not None and p.returncode < 0)
    return code if code >= 0 else 128 - code


def _terminal_modes() -> tuple[int, list] | None:
    """(fd, modes) of the controlling terminal when we are in its foreground, else None."""
    try:
        import termios
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except (ImportError, OSError):
        return None
    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            return fd, termios.tcgetattr(fd)
    except (OSError, termios.error):
        pass
    os.close(fd)
    return None


# What a full-screen program sets and a killed one leaves on: the alternate screen, a hidden
# cursor, mouse reporting, bracketed paste, focus events, the kitty keyboard protocol.
_SCREEN_RESET = b"\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?1004l\x1b[<u"


def _restore_terminal(fd, modes, died: bool):
    import signal
    import termios
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)     # we may have been put in the background
    try:
        termios.tcsetattr(fd, termios.TCSADRAIN, modes)
        if died:
            os.write(fd, _SCREEN_RESET)
    except (OSError, termios.error):
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)
        os.close(fd)


def say_escape_routes(project, session: str):
    """Each step of this session that wrote an escape route, said on the person's terminal once
    the agent is done: the step's own notice went to the agent (a tool call's stderr is its
    output), where the person may never see it."""
    try:
        from ..inert import inert
        from ..view.requests import open_journal
        j = open_journal(project)
        steps = j.steps(session=session) if j else []
    except Exception:           # the agent's work is done; this is only a reminder
        return
    for s in steps:
        kept = [p for p in s.escape_routes if p not in s.taken_back]
        if s.taken_back:
            print(f"envgit: step {s.id} of this session wrote escape routes, files a program outside "
                  f"the sandbox obeys; envgit took them back: {', '.join(inert(p) for p in s.taken_back)}"
                  f" (the step's version: envgit diff {s.id})", file=sys.stderr)
        if "escape-route-written" in s.marks and kept:
            print(f"envgit: step {s.id} of this session WROTE AN ESCAPE ROUTE, a file a program "
                  f"outside the sandbox obeys: {', '.join(inert(p) for p in kept)}; review "
                  f"before running anything here: envgit diff {s.id}; undo: envgit rewind {s.id}",
                  file=sys.stderr)


def announce(agent: str, session: str, how: str):
    print(f"envgit: {agent} session {session} ({how}); its steps: envgit log --session {session}",
          file=sys.stderr)


# --- the agents' resume hints, inside envgit ---------------------------------------------------
# Claude Code and Codex print how to resume a conversation on exit (`claude --resume ID`,
# `codex resume ID`); followed as printed, that runs outside envgit. The same line is said the
# envgit way, for the conversation this launch wrote.

def newest_conversation(pattern_roots: list[tuple[str, str]], since: float) -> str | None:
    """The id of the newest transcript changed since `since` (a time.time()), among the files
    each (directory, glob) names; a transcript's id is its name's last 36 characters (a UUID)
    before `.jsonl`. None when this launch wrote none."""
    import glob
    best = None
    for root, pattern in pattern_roots:
        for path in glob.glob(os.path.join(glob.escape(root), pattern)):
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            name = os.path.basename(path)[:-len(".jsonl")]
            if mtime >= since and len(name) >= 36 and (best is None or mtime > best[0]):
                best = (mtime, name[-36:])
    return best[1] if best else None


def say_resume(line: str | None):
    if line:
        print(f"envgit: to go on with this conversation inside envgit: {line}", file=sys.stderr)
