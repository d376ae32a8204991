"""The project's package cache (sandbox/environ.py: ~/.cache/envgit/<name>-<id>, bound writable
in every step and kept between sessions) from a hostile step.

What a poisoned cache means, and what it must never mean: a later step of the SAME project
reads what an earlier step wrote there (a doctored wheel, a cargo config): the trust a step
already has in the project, whose code the next step runs anyway. It must never reach another
project's cache, the host's own caches (~/.cache/pip, ~/.npm, ~/.cargo), anything outside
the cache directory, or anything the host runs.

The oracles: canary files (never printed), marker files a planted program would create if
it ran, and the host files' bytes."""

import os
import stat
from pathlib import Path

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "the cache lives in the person's home, bound into the step's view: for a non-root user the daemon "
    "runs with runuser's passwd HOME, the cache must be that user's own (environ.py checks its "
    "owner), and bwrap builds the view in a user namespace where DAC does not stop the same person's "
    "files: only the view must")


@pytest.fixture(autouse=True)
def cache_home(attacker):
    """The caches under the test's home: runuser gives the unprivileged attacker's daemon the
    passwd HOME (which does not exist), so the place is named the XDG way, as a person may."""
    attacker.stop()
    attacker.env["XDG_CACHE_HOME"] = str(attacker.home / ".cache")


def caches(attacker) -> list[Path]:
    d = attacker.home / ".cache" / "envgit"
    return sorted(d.iterdir()) if d.is_dir() else []


def second_project(attacker, name="other") -> Path:
    """Another project of the same person, in the same home, with a step that filled its cache."""
    root = attacker.home / name
    root.mkdir()
    attacker.own(root)
    r = attacker.envgit("init", cwd=root)
    assert r.returncode == 0, r.stderr
    r = attacker.envgit("run", "--", "sh", "-c",
                        f'mkdir -p "$PIP_CACHE_DIR" && echo {CANARY} > "$PIP_CACHE_DIR/secret"', cwd=root)
    assert r.returncode == 0, r.stderr
    attacker.envgit("daemon", "stop", cwd=root)
    return root


def test_a_step_cannot_reach_another_projects_cache(attacker):
    second_project(attacker)
    assert attacker.run("true").returncode == 0
    mine, = [c for c in caches(attacker) if c.name.startswith("proj-")]
    theirs, = [c for c in caches(attacker) if c.name.startswith("other-")]
    assert (theirs / "pip" / "secret").read_text().strip() == CANARY
    r = attacker.run(f'ls -A "$XDG_CACHE_HOME/.."; cat "{theirs}/pip/secret"; '
                     f'cat "$XDG_CACHE_HOME/../{theirs.name}/pip/secret"; '
                     f'find / -xdev -name secret 2>/dev/null | xargs -r cat; '
                     f'cat /proc/self/root{theirs}/pip/secret; '
                     f'echo planted > "{theirs}/pip/planted"; '
                     f'echo planted > "$XDG_CACHE_HOME/../{theirs.name}/pip/planted"; true')
    assert CANARY not in r.stdout + r.stderr
    assert r.stdout.split()[0] == mine.name and theirs.name not in r.stdout
    assert not (theirs / "pip" / "planted").exists()
    # and the other way round: the first project's writes stay in its own
    r = attacker.run(f'echo {CANARY}-mine > "$PIP_CACHE_DIR/x" 2>/dev/null || '
                     f'(mkdir -p "$PIP_CACHE_DIR" && echo {CANARY}-mine > "$PIP_CACHE_DIR/x")')
    assert r.returncode == 0, r.stderr
    assert (mine / "pip" / "x").exists() and not (theirs / "pip" / "x").exists()


def test_the_hosts_own_caches_are_neither_read_nor_written(attacker):
    tops = {".cache/pip": "http/secret", ".npm": "_cacache/secret", ".cargo": "registry/secret",
            ".cache/uv": "secret", "go": "pkg/mod/secret"}
    for top, rel in tops.items():
        p = attacker.home / top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(CANARY + "\n")
    listing = {top: sorted(str(x) for x in (attacker.home / top).rglob("*")) for top in tops}
    attacker.own(attacker.home)
    script = ('for v in XDG_CACHE_HOME PIP_CACHE_DIR UV_CACHE_DIR npm_config_cache YARN_CACHE_FOLDER '
              'PNPM_HOME CARGO_HOME GOPATH GOCACHE; do eval d=\\$$v; mkdir -p "$d" && '
              'echo poisoned > "$d/poisoned" || echo "cannot write $v"; done; '
              'cat ~/.cache/pip/http/secret ~/.npm/_cacache/secret ~/.cargo/registry/secret '
              '~/.cache/uv/secret ~/go/pkg/mod/secret 2>&1; '
              'grep -rs CANARY ~ /tmp 2>/dev/null; true')
    r = attacker.run(script)
    assert "cannot write" not in r.stdout, r.stdout
    assert CANARY not in r.stdout + r.stderr
    for top, rel in tops.items():           # nothing written in the host's own caches
        assert sorted(str(x) for x in (attacker.home / top).rglob("*")) == listing[top], top
        assert (attacker.home / top / rel).read_text() == CANARY + "\n"
    mine, = caches(attacker)
    assert (mine / "pip" / "poisoned").exists() and (mine / "cargo" / "poisoned").exists()


def test_the_cache_cannot_be_moved_out_of_place_or_used_to_write_the_host(attacker):
    bashrc = (attacker.home / ".bashrc").read_bytes()
    marker = attacker.root / ".." / "cache-escape-marker"
    assert attacker.run("true").returncode == 0
    mine, = caches(attacker)
    r = attacker.run(
        # replace the directory itself, or its parent's entries
        'rm -rf "$XDG_CACHE_HOME" 2>/dev/null; mv "$XDG_CACHE_HOME" /tmp/moved 2>/dev/null; '
        'ln -s ~ "$XDG_CACHE_HOME/../evil" 2>/dev/null; '
        'mkdir -p "$XDG_CACHE_HOME/../sibling" 2>/dev/null; '
        # links out of it, for a later step or the host to follow
        f'ln -sfn ~/.bashrc "$XDG_CACHE_HOME/bashrc"; '
        f'echo "touch {marker}" >> "$XDG_CACHE_HOME/bashrc" 2>/dev/null; '
        f'ln -sfn ~ "$XDG_CACHE_HOME/home"; '
        f'echo "touch {marker}" > "$XDG_CACHE_HOME/home/.profile" 2>/dev/null; '
        # a hard link to a project file (a later rewind writes the project)
        'echo x > tracked && ln tracked "$XDG_CACHE_HOME/hard" 2>/dev/null; '
        # a setuid copy of a shell for the host to run
        'cp /bin/sh "$XDG_CACHE_HOME/sh" && chmod 4755 "$XDG_CACHE_HOME/sh" 2>/dev/null; '
        'ls -A "$XDG_CACHE_HOME/.."; true')
    st = os.lstat(mine)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    assert [c.name for c in caches(attacker)] == [mine.name]            # nothing beside it
    assert (attacker.home / ".bashrc").read_bytes() == bashrc
    assert not (attacker.home / ".profile").exists() and not marker.exists()
    assert not (mine / "hard").exists()                                  # EXDEV: other mounts
    sh = mine / "sh"
    assert not sh.exists() or not os.stat(sh).st_mode & (stat.S_ISUID | stat.S_ISGID)
    # the symlinks left in the cache lead, on the host, where they say; nothing on the host
    # follows them (no host program reads ~/.cache/envgit), and inside the next step they
    # resolve in that step's read-only view
    r = attacker.run('echo again > "$XDG_CACHE_HOME/bashrc"; echo again > "$XDG_CACHE_HOME/home/x"; true')
    assert (attacker.home / ".bashrc").read_bytes() == bashrc and not (attacker.home / "x").exists()
    assert r.returncode == 0


def test_a_step_cannot_choose_its_cache(attacker):
    """The cache's name comes from the project's path and a key in .envgit/, which no step
    sees, and the daemon's own environment; the environment a step is asked for with
    (XDG_CACHE_HOME here, as an agent's inner step could send it) decides nothing."""
    assert attacker.run("true").returncode == 0
    mine, = caches(attacker)
    key = (attacker.root / ".envgit" / "cache-key").read_text()
    other = attacker.home / ".cache" / "envgit" / "chosen"
    r = attacker.run('cat .envgit/cache-key; echo forged > .envgit/cache-key; '
                     'echo "$XDG_CACHE_HOME"', env={"XDG_CACHE_HOME": str(other)})
    assert key.strip() not in r.stdout
    assert (attacker.root / ".envgit" / "cache-key").read_text() == key
    assert r.stdout.strip().splitlines()[-1] == str(mine)
    assert not other.exists() and [c.name for c in caches(attacker)] == [mine.name]


def test_a_later_step_of_the_same_project_reads_what_an_earlier_one_left(attacker):
    """The one thing a cache is for, and the trust it implies (said in the module doc): a
    later step of the same project, in a later session, finds an earlier step's files."""
    r = attacker.run('mkdir -p "$PIP_CACHE_DIR" && echo from-step-1 > "$PIP_CACHE_DIR/note"')
    assert r.returncode == 0, r.stderr
    attacker.stop()
    r = attacker.run('cat "$PIP_CACHE_DIR/note"')
    assert r.stdout == "from-step-1\n", r.stderr
