"""Claude Code's config directory under `envgit claude` (CLAUDE_CONFIG_DIR), so that what
Claude remembers between sessions (~/.claude.json: onboarding done, theme, the folders it was
told to trust, answered notices) persists from one `envgit claude` to the next, and it never
asks its start-up questions twice.

Claude writes ~/.claude.json through a temporary file beside it and a rename, so the file needs
a writable directory; the home directory inside the sandbox is read-only, and the person's own
~/.claude.json must stay so (its mcpServers are run by the next plain `claude`, outside any
sandbox). So Claude is given a directory of its own, per project, outside the project and out
of every step's view:

    $XDG_STATE_HOME/envgit/claude/<project>-<id>/    (~/.local/state/envgit/claude/…)
        .claude.json       Claude's own, writable: the person's ~/.claude.json at the first
                           launch, then what Claude wrote; at each launch the person's keys
                           are taken again where this copy has none (a login made outside)
        backups/           Claude's backups of it
        <name> -> ~/.claude/<name>    (or the person's own $CLAUDE_CONFIG_DIR)
                           a symlink for every entry of the person's ~/.claude: inside, those
                           resolve to ~/.claude's mounts (read-only, but for claude.py's
                           CLAUDE_WRITABLE state directories), so settings, hooks, commands,
                           agents and CLAUDE.md are the person's and read-only as before, and
                           the transcripts are in ~/.claude/projects, where --resume finds them

Anything else Claude leaves in the directory (a file written over one of the symlinks, a name
a later Claude adds) is removed at the next launch: only Claude's own state survives, and
nothing here is read as settings by a plain `claude`.
"""

import json
import os
import shutil

KEEP = (".claude.json", "backups")      # what survives a launch; ".claude.json.*" too (its lock, backups)


def config_dir(project_cache: str | None, environ=os.environ) -> str | None:
    """This project's Claude config directory (created, 0700), named like its package cache
    (sandbox/environ.py: the project's path and the random key in .envgit/), or None when there
    is no usable place (then Claude runs with the read-only ~/.claude.json, as before)."""
    if not project_cache:
        return None
    root = environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(root):
        home = environ.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home) or home == "/":
            return None
        root = os.path.join(home, ".local", "state")
    path = os.path.join(root, "envgit", "claude", os.path.basename(project_cache))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
        return None
    return path


def _kept(name: str) -> bool:
    return name in KEEP or name.startswith(".claude.json.")


def prepare(cfg: str, state: str, person: str) -> None:
    """Lay out `cfg` for a launch: leftovers removed, the entries of the person's Claude
    directory `state` (~/.claude) linked, .claude.json seeded or refreshed from theirs
    (`person`, ~/.claude.json)."""
    for name in os.listdir(cfg):
        if _kept(name):
            continue
        path = os.path.join(cfg, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    for name in sorted(os.listdir(state)) if os.path.isdir(state) else ():
        if not _kept(name):
            os.symlink(os.path.join(state, name), os.path.join(cfg, name))
    _merge_config(person, os.path.join(cfg, ".claude.json"))


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _merge_config(person: str, own: str) -> None:
    """Claude's copy keeps what it wrote; keys only the person's file has are added (an account
    logged in outside envgit, a setting made there)."""
    theirs, mine = _read(person), _read(own)
    if theirs is None:
        return
    merged = {**theirs, **(mine or {})}
    if merged == mine:
        return
    # Claude writes in this directory too: never through a name it could have planted.
    from ..atomicfile import write_atomic
    write_atomic(own, json.dumps(merged, indent=2), 0o600)
