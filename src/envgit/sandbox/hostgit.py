"""git as envgit runs it outside any sandbox (the session daemon, `envgit policy check`): only
`git config`, on files named explicitly, with the git binary from a trusted system directory.

Why so narrow. The daemon runs on the host, often as root, and a step can write the project,
its `.git/commondir`, a `.git` file pointing anywhere, and so any repository config git would
discover. Git obeys dozens of config keys that run a program (core.fsmonitor on any index read,
core.sshCommand, a promisor remote's lazy fetch, hooks, pager, textconv, …) and new ones appear
with new git versions. Denying the ones we know is a list we would keep losing, so the daemon
never asks git to do anything that can reach one: `git config --list` reads configuration and
runs nothing, whatever it holds. Everything else envgit needs from a repository it reads
itself (the index: tracked.py; the hooks directory: gitroutes.py). What a repository config
*includes* is never read here either (`--no-includes`, see gitconfig.py): a step could point
it at any file root can read.

The binary comes from `launch.trusted_binary` (the same resolver as bwrap and socat), never
PATH: an activated project virtualenv puts `.venv/bin`, which every step can write, first.
Its environment is built from nothing: no PATH into the project, no pager, no prompts, no lazy
fetch, no system or global config unless the caller asks for the person's.
"""

import os
import subprocess

GIT_TIMEOUT_S = 5
SAFE_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


class NoGit(Exception):
    pass


def git_binary() -> str:
    """The absolute path of a trusted git (TRUSTED_DIRS or $ENVGIT_GIT), or NoGit."""
    from .launch import LaunchError, trusted_binary
    try:
        return trusted_binary("git")
    except LaunchError as e:
        raise NoGit(str(e)) from None


def base_env(home: str) -> dict:
    """What every host git gets: nothing from the caller's environment but the home."""
    return {"PATH": SAFE_PATH, "HOME": home or "/nonexistent", "LC_ALL": "C",
            "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat",
            "GIT_NO_LAZY_FETCH": "1", "GIT_OPTIONAL_LOCKS": "0", "GIT_NO_REPLACE_OBJECTS": "1"}


def person_env(home: str) -> dict:
    """For the person's own config (system, global): their home, and the daemon's XDG and
    GIT_CONFIG_* settings (inherited from the person's `envgit run` that started it)."""
    env = base_env(home)
    for k, v in os.environ.items():
        if k in ("XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",
                 "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS") or \
                k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")):
            env[k] = v
    return env


def file_env(home: str) -> dict:
    """For one file named with --file: no system or global config, no repository at all."""
    return {**base_env(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_DIR": os.devnull}


def config_list(args, cwd: str, env: dict) -> bytes | None:
    """`git config ARGS --list -z` (stdout), or None if git could not say. The only git command
    envgit runs outside a sandbox."""
    try:
        git = git_binary()
    except NoGit:
        return None
    try:
        r = subprocess.run([git, "-c", "safe.directory=*", "config", *args, "--list", "-z"],
                           cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode not in (0, 1):          # 1: nothing set
        return None
    return r.stdout


def person_config(scope: str, cwd: str, home: str, extra=()) -> bytes | None:
    """The person's `--system` or `--global` config, includes resolved (a step cannot write
    those files). Read from `cwd` so `includeIf "gitdir:…"` applies as there; git refuses to
    read from a repository it does not understand (an unknown extension a step wrote, an
    include of a file that is no config), so then it is read from nowhere, without the
    conditional includes, rather than not at all.

    The global scope is every file git reads as global, asked of git by scope: `git config
    --global` names one file only (~/.gitconfig when it exists, git 2.39), while git itself
    reads the XDG file ($XDG_CONFIG_HOME/git/config, ~/.config/git/config) as well, first."""
    env = person_env(home)
    if scope == "--global":
        args = ["--show-scope", "--includes", *extra]
        env["GIT_CONFIG_NOSYSTEM"] = "1"
    else:
        args = [scope, "--includes", *extra]
    out = config_list(args, cwd, env)
    if out is None:
        out = config_list(args, "/", {**env, "GIT_DIR": os.devnull})
    if out is None or scope != "--global":
        return out
    return only_scope(out, "global", "--show-origin" in extra)


def only_scope(out: bytes, scope: str, origins: bool) -> bytes:
    """`--show-scope -z` output cut to one scope's entries, the scope field dropped: what the
    same command without --show-scope prints for them. Each entry is
    scope NUL [origin NUL] key LF value NUL."""
    parts = out.split(b"\0")
    width = 3 if origins else 2
    res = []
    for i in range(0, len(parts) - width + 1, width):
        if parts[i].decode("utf-8", "surrogateescape") == scope:
            res.extend(parts[i + 1:i + width])
    return b"".join(f + b"\0" for f in res)


def file_entries(path: str, home: str, origins: bool = False) -> list | None:
    """One config file's entries [(key, value or None)] (with origins: [(origin, key, value)]),
    its includes not followed."""
    out = config_list(["--file", path, "--no-includes", *(["--show-origin"] if origins else [])],
                      "/", file_env(home))
    return None if out is None else parse(out, origins)


def parse_scoped(out: bytes) -> list:
    """`--show-scope --show-origin -z` output: [(scope, origin, key, value or None)]."""
    parts = out.split(b"\0")
    res = []
    for i in range(0, len(parts) - 2, 3):
        key, nl, value = parts[i + 2].partition(b"\n")
        res.append((parts[i].decode("utf-8", "surrogateescape"), parts[i + 1].decode("utf-8", "surrogateescape"),
                    key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape") if nl else None))
    return res


def parse(out: bytes, origins: bool = False) -> list:
    parts = [p for p in out.split(b"\0")]
    if parts and parts[-1] == b"":
        parts.pop()
    res = []
    it = iter(parts)
    for rec in it:
        origin = None
        if origins:
            origin, rec = rec.decode("utf-8", "surrogateescape"), next(it, b"")
        key, nl, value = rec.partition(b"\n")
        item = (key.decode("utf-8", "surrogateescape"),
                value.decode("utf-8", "surrogateescape") if nl else None)
        res.append((origin, *item) if origins else item)
    return res
