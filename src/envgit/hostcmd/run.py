"""Running a host command a policy names, the one way: a credential's `from: command`
(credentials/source.py) and an MCP stdio server (mcp/upstream.py); and an MCP url server's
URL, whose `${VAR}`s are expanded as a stdio server's are (url_server).

Each runs only once trusted (trust.py), and from outside the project, so that nothing a step
wrote decides what runs:
- cwd `/`: `npx NAME` finds no `node_modules/.bin` of the project, `python3 -m mod` no module a
  step planted beside the project's files, a relative path nothing of the project's;
- PATH is the person's, less every entry a step can write (relative ones, the project, an
  allow_write, the package cache, a directory others can write), with the
  system's directories after it;
- the environment is built, not inherited: a minimal base (BASE, below) and what the entry
  names; loader variables (PYTHONPATH, NODE_OPTIONS, LD_PRELOAD, …) are never set, and an
  entry naming one is refused; PYTHONSAFEPATH=1 (Python's -P: the script's or cwd's directory
  is not put first on sys.path);
- a project's command gets no variable env.deny names nor one an organisation credential
  reads: `${ORG_TOKEN}` in a project server's env is refused, and `printenv ORG_TOKEN` prints
  nothing (credentials/source.py then refuses output equal to an organisation credential's
  value sent to other hosts).
"""

import os
import re
import shutil
import subprocess

from . import trust
from .writable import step_writable

# The base every host command gets, and why each: HOME (a tool's own config and caches:
# gh's hosts.yml, ~/.npm for npx, a keyring's files), USER/LOGNAME (tools and agents that
# look the person up), LANG/LANGUAGE/LC_* (output decoded as the person's tools write it),
# XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS (where a keyring or gpg agent answers: `pass`,
# `secret-tool`, `gh auth token` with a keyring; addresses, never secrets). Nothing else of
# the caller's environment: its tokens, proxies and loader variables stay out. (The MCP SDK
# adds SHELL and TERM of `envgit mcp`'s own environment to a stdio server's: neither loads code.)
BASE = ("HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Variables that make a program load code from somewhere else than it would: never set.
LOADER_VARS = {"PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
               "PYTHONSAFEPATH", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "NODE_PATH",
               "NODE_OPTIONS", "NODE_EXTRA_CA_CERTS", "PERL5LIB", "PERL5OPT", "PERLLIB",
               "RUBYLIB", "RUBYOPT", "BASH_ENV", "ENV", "GCONV_PATH", "JAVA_TOOL_OPTIONS",
               "GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"}
LOADER_PREFIXES = ("LD_", "DYLD_", "NPM_CONFIG_", "GIT_CONFIG_")


class HostCommandError(Exception):
    """A host command that may not run as given; str() names the policy's line and the fix."""


def _loader(name: str) -> bool:
    return name in LOADER_VARS or name.upper().startswith(LOADER_PREFIXES)


def safe_path(policy, environ) -> str:
    """The person's PATH without what a step can write, then the system's directories."""
    out: list[str] = []
    for d in (environ.get("PATH") or "").split(":") + list(SYSTEM_PATH):
        if not d.startswith("/") or d in out or not os.path.isdir(d):
            continue
        try:
            st = os.stat(d)
        except OSError:
            continue
        if st.st_mode & 0o002 or st.st_uid not in (0, os.geteuid()) or \
                step_writable(policy, d, environ):
            continue
        out.append(d)
    return ":".join(out)


def _withheld(policy) -> list[str]:
    """Variable names (globs with a trailing *) a project's host command never gets."""
    names = list(getattr(policy, "env_deny", []) or [])
    for o in getattr(policy, "org_credentials", []) or []:
        src = (policy.credentials.get(o) or {}).get("from") or {}
        if "env" in src:
            names.append(src["env"])
    return names


def _covered(name: str, patterns: list[str]) -> bool:
    from ..policy.overlaps import env_overlap
    return any(env_overlap(name, p) for p in patterns)


def url_server(policy, name: str, spec: dict, environ) -> str:
    """The URL of MCP url server `name`, trusted, its `${NAME}`s expanded (none that env.deny
    names or an organisation credential reads, for a project's)."""
    from ..policy.hostentries import mcp_approves
    entry = trust.require(policy, "mcp", name, mcp_approves(spec), environ)
    return expand(spec["url"], entry, policy, environ)


def expand(value: str, entry: dict, policy, environ) -> str:
    """'${NAME}' from the caller's environment (empty when unset); a project entry naming a
    variable env.deny names or the organisation's credential reads is refused."""
    withheld = [] if entry["org"] else _withheld(policy)

    def one(m):
        name = m.group(1)
        if _covered(name, withheld):
            raise HostCommandError(f"{entry['where']}: {entry['key'].rsplit('.', 1)[0]} takes "
                                   f"${{{name}}}, which env.deny or an organisation credential "
                                   "withholds from the project; remove it")
        return environ.get(name, "")
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", one, value)


def environment(policy, entry: dict, extra: dict[str, str], environ) -> dict[str, str]:
    """The whole environment of a host command: BASE and LC_* from `environ`, the safe PATH,
    PYTHONSAFEPATH=1, then `extra` (the entry's own `env`)."""
    withheld = [] if entry["org"] else _withheld(policy)
    env = {k: v for k, v in environ.items()
           if (k in BASE or k.startswith("LC_")) and not _covered(k, withheld)}
    env["PATH"] = safe_path(policy, environ)
    env["PYTHONSAFEPATH"] = "1"
    for k, v in extra.items():
        if _loader(k):
            raise HostCommandError(f"{entry['where']}: {entry['key'].rsplit('.', 1)[0]}.env sets "
                                   f"{k}, which decides what code the program loads; envgit runs "
                                   "host commands without it: remove it")
        env[k] = v
    return env


def run_credential(policy, name: str, command: str, environ, timeout: float):
    """Run credential `name`'s `from: command` (trusted with its hosts, from /, its environment
    built); the CompletedProcess (text). Raises Untrusted, HostCommandError, OSError,
    TimeoutExpired."""
    from ..policy.hostentries import credential_approves
    cred = policy.credentials.get(name) or {}
    if cred.get("from") != {"command": command}:
        raise trust.Untrusted(f"{policy.path}: credential {name}: not as the loaded policy "
                              "names it; review it with `envgit trust`")
    entry = trust.require(policy, "credential", name, credential_approves(cred), environ)
    env = environment(policy, entry, {}, environ)
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd="/")


def stdio_server(policy, name: str, spec: dict, environ) -> tuple[str, list[str], dict[str, str]]:
    """(program, args, environment) of MCP server `name`, trusted, to start from `/`."""
    from ..policy.hostentries import mcp_approves
    entry = trust.require(policy, "mcp", name, mcp_approves(spec), environ)
    env = environment(policy, entry, {k: expand(v, entry, policy, environ)
                                      for k, v in (spec.get("env") or {}).items()}, environ)
    cmd = expand(spec["command"], entry, policy, environ)
    args = [expand(a, entry, policy, environ) for a in spec.get("args") or []]
    if "/" in cmd:
        if not cmd.startswith("/"):
            raise HostCommandError(f"{entry['where']}: {cmd!r} is a relative path; host commands "
                                   "run from / : name the program by absolute path or by name")
        prog: str | None = cmd
    else:
        prog = shutil.which(cmd, path=env["PATH"])
        if prog is None:
            raise HostCommandError(f"{entry['where']}: {cmd} is not on the PATH host commands get "
                                   "(yours, less what a step can write); name it by absolute path")
    assert prog is not None
    if step_writable(policy, prog, environ):
        raise HostCommandError(f"{entry['where']}: {prog} is in a place a step can write; a "
                               "server started from there runs what a step put there: install "
                               "it outside the project")
    return prog, args, env
