"""The placeholders that cover a step's denied paths, one inode per path, so that the daemon
can tell which one a step opened (daemon/denials.py watches them with inotify).

Why readable placeholders and not unreadable ones: the kernel refuses an unreadable file
(mode 000) in its permission check, before any hook an unprivileged process can watch
(inotify and unprivileged fanotify see only opens that succeed; fanotify's permission events
and Landlock's audit log need the host's root; seccomp user notification would send every
open of every step to a supervisor: docs/ARCHITECTURE.md "A denial said where it happens"
has the figures). A placeholder a step can open, whose open the daemon sees, is what lets
envgit say the refusal at the moment it happens, for every user.

So a denied file reads as one comment line saying it is hidden and by what (`#` starts a
comment in dotenv, shell, YAML, TOML, INI and ssh_config files, so a program that loads it
finds nothing in it, as with an empty file; a key or JSON reader fails to parse it, as with
an empty one), and a denied directory is an empty, read-only directory holding a placeholder
of the same kind for each of its entries (at most MIRRORED of them, names only: what a step
looks for inside is said too). The secret's bytes are never in the view; every placeholder is
bound read-only, and lives under the project's .envgit/, which no step can see or write.
"""

import itertools
import os
import shutil

from ..inert import inert

MIRRORED = 64           # entries of one denied directory shown by name (the first, sorted,
READ_AT_MOST = 4096     # of at most this many it lists)
MAX_FILES = 4096        # placeholder files a set holds; past it a path shares one, unwatched


def deny_origin(policy):
    """entry -> where it is written: `envgit.yaml:LINE`, or which built-in list."""
    where = getattr(policy, "where", {}) or {}
    lines = {}
    for i, e in enumerate(getattr(policy, "deny_read", ()) or ()):
        w = where.get(f"filesystem.deny_read[{i}]", "")
        lines.setdefault(e, "envgit's built-in list" if w in ("", "default") else w)

    def of(entry: str) -> str:
        if entry in lines:
            return lines[entry]
        if entry.startswith("credentials."):
            return f"{entry}: a credential's file"
        return "envgit's built-in list"
    return of


# The rule of a path hidden as another name of a denied file (view.py: a hard link, what a
# denied name's symlink leads to): no deny entry names it, and no allow_read entry lifts it.
ALIAS_RULE = "another name of a denied file"


def placeholder_text(path: str, rule: str, where: str) -> bytes:
    """The one line a denied file reads as (the path and rule inert: a step chose the name)."""
    if rule == ALIAS_RULE:
        return (f"# envgit: {inert(path)} is another name (a link) of a file filesystem.deny_read "
                f"hides, so hidden from this sandbox too; its contents are not shown here\n").encode()
    return (f"# envgit: {inert(path)} is hidden from this sandbox by filesystem.deny_read "
            f"'{inert(rule)}' ({inert(where)}); its contents are not shown here\n").encode()


def shown(path: str) -> str:
    """`path` as text: a byte of a name that is not UTF-8 (a step chose it) as its escape, as
    snapshots show it. Raw, it could be neither written in the placeholder's line nor kept in
    the step's end entry: every later view, and the end, would fail on it."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class Masks:
    """The placeholders of views, in `directory`, made once and used again by later views
    (daemon/denials.py keeps a few of these, one per step running at once): `covers` maps each
    placeholder file to (the path it stands for, the deny entry, where that entry is written);
    `dirs` lists the denied directories' placeholders made in it; `used` what the view being
    built binds (begin() starts one); `owner` is the step whose view binds them now.

    The daemon watches `directory` and those directories, not each file: an open of any file in
    a watched directory is reported with its name, so every placeholder file is watched whatever
    their number (no limit a step's planted `.env` files could fill ahead of the person's), and
    the person's own inotify watches are not spent on them. A file is therefore written under
    another name and renamed in: the daemon's own open would read as a step's."""

    def __init__(self, directory: str):
        self.directory = directory
        self.covers: dict[str, tuple[str, str, str]] = {}
        self.dirs: list[str] = []
        self.used: set[str] = set()
        self.owner = None
        self._made: dict[tuple, str] = {}
        self._n = 0
        os.makedirs(directory, mode=0o755, exist_ok=True)

    def begin(self) -> None:
        self.used = set()

    def cover(self, path: str, rule: str, where: str, follow: bool = False) -> str:
        """The placeholder to bind read-only at `path`: a file, or a directory as `path` is one.
        `follow`: a link at `path` is typed by what it leads to (the home's own denied paths:
        a ~/.aws kept in a dotfiles checkout, which a file would make "Not a directory");
        otherwise a link, even one a step swapped in after view.py resolved it, is a file and
        nothing it leads to is listed."""
        entries = _listing(path, follow)
        if entries is not None:
            names, kinds = tuple(n for n, _ in entries), tuple(k for _, k in entries)
            key: tuple = (path, rule, where, names, kinds)
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self._directory(path, rule, where, names, kinds)
        else:
            key = (path, rule, where)
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self._file(path, rule, where, self._next(), staged=True)
        self.used.add(made)
        return made

    def _next(self) -> str:
        self._n += 1
        return os.path.join(self.directory, str(self._n))

    def _file(self, path, rule, where, at, staged=False) -> str:
        """Write the placeholder at `at`; `staged`: `at` is in a watched directory, so written
        beside the set (never watched) and renamed in."""
        path = shown(path)
        if len(self.covers) >= MAX_FILES:
            at = os.path.join(self.directory, "shared")
            if os.path.exists(at):
                return at
            path, rule, where = "a denied path", "(several)", "envgit.yaml and the built-in list"
        to = self.directory + ".part" if staged else at
        if staged and os.path.lexists(to):
            os.unlink(to)
        fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        try:
            os.write(fd, placeholder_text(path, rule, where))
        finally:
            os.close(fd)
        if staged:
            os.rename(to, at)
        if not at.endswith("/shared"):
            self.covers[at] = (path, rule, where)
        return at

    def _directory(self, path, rule, where, names, kinds) -> str:
        """An empty read-only directory holding a placeholder for each entry: written before
        the daemon watches it (watch() comes after the view is built)."""
        at = self._next()
        os.mkdir(at, 0o755)
        for name, is_dir in zip(names, kinds, strict=True):
            if is_dir:
                os.mkdir(os.path.join(at, name), 0o555)
            else:
                self._file(os.path.join(path, name), rule, where, os.path.join(at, name))
        os.chmod(at, 0o555)
        self.dirs.append(at)
        return at


def _listing(path: str, follow: bool):
    """[(name, is a directory)] of the first MIRRORED entries of the directory at `path`, read
    through the one descriptor that was checked to be a directory; None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError:
        # a directory this process cannot read is still one: shown empty (a file bound onto it
        # would fail every view)
        return [] if os.path.isdir(path) and (follow or not os.path.islink(path)) else None
    try:
        with os.scandir(fd) as it:       # the type from the listing: no stat a name
            # at most READ_AT_MOST read: a step's `.env` directory of 200,000 files cost each
            # view ~1 s on the daemon's loop (every other step waits), for 64 names shown
            first = itertools.islice(it, READ_AT_MOST)
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in first)[:MIRRORED]
    except OSError:
        return []
    finally:
        os.close(fd)


def remove(directory: str) -> None:
    """Placeholders gone (their read-only directories made writable first)."""
    if not os.path.isdir(directory) or os.path.islink(directory):
        return
    for d, dirs, _ in os.walk(directory):
        for n in dirs:
            try:
                os.chmod(os.path.join(d, n), 0o755)
            except OSError:
                pass
    shutil.rmtree(directory, ignore_errors=True)
