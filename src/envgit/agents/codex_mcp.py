"""The person's MCP servers under `envgit codex`.

Codex starts a stdio MCP server only in a local environment, and under `envgit codex` its one
environment is envgit's exec-server (`include_local = false`): every `[mcp_servers.NAME]`
with a `command` is refused. For the entries that start envgit's own server (`envgit mcp`,
`python -m envgit mcp`) envgit starts that server itself, on the host, over HTTP on a free
port of 127.0.0.1, for the project and session of this run (ENVGIT_SESSION: its executions
are steps of the agent's session, a sub-session `<session>.mcpN`), with a random bearer token
(ENVGIT_MCP_TOKEN) that only Codex is given. Codex is pointed at it by one `-c mcp_servers={…}`
override: an override merges into the person's table (a `url` beside their `command` is
refused), so their entry is disabled and an entry `NAME_session` with the `url` added. Other
stdio servers are said, once: Codex will not start them.

The entries are Codex's own view of its configuration (`codex mcp list --json`, with the
person's `-c` overrides): their config.toml, a trusted project's .codex/config.toml, managed
configuration.
"""

import json
import os
import re
import secrets
import subprocess
import sys
import time

START_TIMEOUT_S = 60        # envgit mcp connects to its upstream servers before it serves
STOP_TIMEOUT_S = 10
LIST_TIMEOUT_S = 30
SERVING = re.compile(r"^envgit mcp: serving (http://\S+)$", re.M)


def codex_servers(codex: str, env: dict, cwd: str, overrides: list[str]) -> list[dict]:
    """Codex's MCP server entries as it would load them here; [] when it cannot say (a
    config it cannot parse: Codex then says so itself)."""
    try:
        r = subprocess.run([codex, "mcp", "list", "--json", *overrides], env=env, cwd=cwd,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=LIST_TIMEOUT_S)
        servers = json.loads(r.stdout) if r.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    return [s for s in servers if isinstance(s, dict) and isinstance(s.get("transport"), dict)]


def config_overrides(argv: list[str]) -> list[str]:
    """The person's `-c key=value` arguments to Codex (before a `--`), as `-c` pairs."""
    out = []
    args = iter(argv)
    for a in args:
        if a == "--":
            break
        if a in ("-c", "--config"):
            value = next(args, None)
            if value is not None:
                out += ["-c", value]
        elif a.startswith("--config="):
            out += ["-c", a[len("--config="):]]
        elif a.startswith("-c") and len(a) > 2:
            out += ["-c", a[2:].removeprefix("=")]
    return out


def starts_envgit_mcp(transport: dict) -> bool:
    """A stdio entry whose command is envgit's MCP server: `envgit mcp …` (on PATH or by a
    path), `python -m envgit mcp …`, `python -m envgit.mcp …`."""
    if transport.get("type") != "stdio":
        return False
    prog = os.path.basename(str(transport.get("command") or ""))
    args = [str(a) for a in transport.get("args") or []]
    if prog == "envgit":
        return args[:1] == ["mcp"]
    if not re.fullmatch(r"python[0-9.]*", prog) or "-m" not in args:
        return False
    i = args.index("-m")
    if not all(a.startswith("-") for a in args[:i]):
        return False        # a script before -m: not envgit's module
    return args[i + 1:i + 3] == ["envgit", "mcp"] or args[i + 1:i + 2] == ["envgit.mcp"]


class SessionServer:
    """`envgit mcp --http 127.0.0.1:0` for this session: a child of `envgit codex`, in a
    session of its own (the terminal's Ctrl-C is Codex's), ended with it."""

    def __init__(self, project, session: str, log_path: str, env_extra: dict):
        self.token = secrets.token_urlsafe(32)
        self.log_path = log_path
        env = {**os.environ, **env_extra, "ENVGIT_SESSION": session, "ENVGIT_MCP_TOKEN": self.token}
        # as the daemon starts envgit: nothing a step writes in the project on its import path
        from ..importpath import PYTHON_ARGS, SPAWN_CWD
        argv = [sys.executable, *PYTHON_ARGS, "-m", "envgit", "mcp", "--http", "127.0.0.1:0",
                "--project", project.root]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=SPAWN_CWD, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True,
                                         preexec_fn=_end_with_parent)

    def wait_serving(self, timeout=START_TIMEOUT_S) -> str:
        """Its URL once it serves; raises StartError with its last words if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            found = SERVING.search(self._log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise StartError(f"it exited with status {self.proc.returncode}: {self._last_line()}")
            if time.monotonic() > deadline:
                self.stop()
                raise StartError(f"it was not serving after {timeout} s")
            time.sleep(0.05)

    def _log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _last_line(self) -> str:
        lines = [ln for ln in self._log().splitlines() if ln.strip()]
        return lines[-1] if lines else "(it said nothing)"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class StartError(Exception):
    pass


def _end_with_parent():
    """SIGTERM to the server when `envgit codex` dies, however it dies (kill -9 included):
    it holds the person's upstream tokens and would otherwise serve on with nobody to stop it."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def entry_name(name: str, taken: set[str]) -> str:
    new, n = f"{name}_session", 2
    while new in taken:
        new, n = f"{name}_session{n}", n + 1
    return new


def _inline(pairs) -> str:
    """A TOML inline table of (key, value) pairs; a value is a dict, str, number or bool."""
    def value(v):
        if isinstance(v, dict):
            return _inline(v.items())
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)        # a JSON string or number is valid TOML
    return "{" + ", ".join(f"{json.dumps(k)} = {value(v)}" for k, v in pairs) + "}"


def prepare(codex: str, env: dict, argv: list[str], project, session: str, log_path: str):
    """(Codex's `-c` arguments, the server to stop when Codex exits or None); what was done
    and what will not work is said on stderr. Codex finds the server's token in its
    environment's ENVGIT_MCP_TOKEN (the sandbox drops *_TOKEN variables from every step's)."""
    servers = codex_servers(codex, env, os.getcwd(), config_overrides(argv))
    local = [s for s in servers if s.get("enabled") and s["transport"].get("type") == "stdio"]
    ours = [s for s in local if starts_envgit_mcp(s["transport"])]
    others = [s["name"] for s in local if s not in ours]
    if others:
        print(f"envgit: Codex will not start the stdio MCP server{'s' if len(others) > 1 else ''} "
              f"{', '.join(_quoted(n) for n in others)}: it starts those only in a local "
              "environment, and under envgit codex its one environment is envgit's sandbox "
              "(a server Codex reaches by `url =` works)", file=sys.stderr)
    if not ours:
        return [], None
    extra = {}
    for s in ours:          # the variables the person gave their entries, theirs to have
        extra.update({str(k): str(v) for k, v in (s["transport"].get("env") or {}).items()})
    server = SessionServer(project, session, log_path, extra)
    try:
        url = server.wait_serving()
    except StartError as e:
        print(f"envgit: envgit's MCP server for Codex did not start ({e}; its log: {log_path}): "
              f"Codex will not have {', '.join(_quoted(s['name']) for s in ours)}", file=sys.stderr)
        return [], None
    taken = {s["name"] for s in servers}
    entries = []
    for s in ours:
        name = entry_name(s["name"], taken)
        taken.add(name)
        fields = {"url": url, "bearer_token_env_var": "ENVGIT_MCP_TOKEN"}
        for key in ("startup_timeout_sec", "tool_timeout_sec"):
            if isinstance(s.get(key), (int, float)):
                fields[key] = s[key]
        entries += [(s["name"], {"enabled": False}), (name, fields)]
        print(f"envgit: Codex cannot start stdio MCP servers in a remote environment; envgit's MCP "
              f"server {_quoted(s['name'])} runs at {url} for this session (as {_quoted(name)})",
              file=sys.stderr)
    # one table for them all: Codex splits a -c key at every dot, even inside quotes, so
    # `mcp_servers.NAME.enabled` cannot name a server whose name has one
    return ["-c", f"mcp_servers={_inline(entries)}"], server


def _quoted(name: str) -> str:
    return json.dumps(name)
