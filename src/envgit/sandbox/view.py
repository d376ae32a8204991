"""The filesystem a step sees, as bwrap arguments.

The view is built from an allow-list, not by hiding things in a copy of `/`:
  /usr /bin /lib* /etc /opt …   read-only (SYSTEM_DIRS), with default denies masked (/etc/shadow)
  /proc /dev                     fresh (pid namespace's own /proc, a minimal /dev)
  /run /var/tmp                  empty tmpfs: no host sockets (docker.sock, dbus, ssh-agent)
  /tmp                           the session's private tmp under .envgit/
  /etc/resolv.conf               nameserver 127.0.0.1: the step's own resolver (resolver.py)
  $HOME                          an empty read-only tmpfs, plus allow_read entries (toolchains)
                                 and a sanitised ~/.gitconfig (gitconfig.py)
  ~/.cache/envgit/<project>-<id> the project's package caches, writable (environ.py)
  the project                    writable; envgit.yaml, the escape routes (routes.py: git's
                                 config and hooks in every repository, the core.hooksPath dir,
                                 .envrc, .npmrc, agents' settings…) and `protect` read-only,
                                 git configs as sanitised copies; .envgit/ an empty read-only
                                 directory; denied files masked
Bind order matters to bwrap (later mounts cover earlier ones), so the list is built in that order.

A masked path is covered by a placeholder of its own (masks.py): a file that reads as one
comment line saying it is hidden and by what, or an empty directory; the daemon sees a step open
one and says so at once (daemon/denials.py). The home's denied paths are placeholders too.
"""

import glob as globmod
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ..atomicfile import write_atomic
from ..paths import inside as _inside
from ..policy import Rules, defaults, is_denied
from ..policy.decide import SYSTEM_DIRS
from ..policy.globs import has_magic
from . import aliases
from .gitconfig import ConfigCopies
from .masks import ALIAS_RULE, Masks
from .projectscan import ProjectScan
from .routes import for_project, has_private_key, unshare_links

_COPIES: dict[str, ConfigCopies] = {}      # per state dir: the sanitised git config copies


@dataclass
class View:
    args: list[str] = field(default_factory=list)
    masked: list[str] = field(default_factory=list)   # every path covered by a deny
    protected: list[str] = field(default_factory=list)  # every path bound read-only in the project


def build_view(rules: Rules, state_dir: str, session_tmp: str, scan: ProjectScan,
               masks: Masks, where_of: Callable[[str], str], cache: str | None = None) -> View:
    """`masks`: where the denied paths' placeholders are made; `where_of(entry)`: where a deny
    entry is written (the placeholder and the daemon's line say it)."""
    v = View()
    a = v.args
    project, home = rules.project, rules.home
    blank_dir = _sentinels(state_dir)

    for name in sorted(os.listdir("/")):
        path = "/" + name
        if os.path.islink(path):
            a += ["--symlink", os.readlink(path), path]
        elif name in SYSTEM_DIRS and os.path.isdir(path):
            a += ["--ro-bind", path, path]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run",
          "--dir", "/var", "--tmpfs", "/var/tmp", "--symlink", "../run", "/var/run",
          "--bind", session_tmp, "/tmp"]
    a += _resolv_conf(state_dir)
    has_home = home not in ("", "/") and project != home and not _inside(home, project)
    if has_home:
        a += ["--tmpfs", home]

    # Extra read-only paths: toolchains in the home view, and any allow_read outside it.
    visible = [p for p, _ in rules.allow_abs for p in _expand(p)
               if os.path.exists(p) and not _inside(p, project) and not _covered(p)]
    for p in _outermost(visible):
        a += ["--ro-bind", p, p]
    for p, _ in rules.write_abs:
        if os.path.exists(p) and p != project:
            a += ["--bind", p, p]
    a += ["--bind", project, project]
    if cache:                            # the project's package caches (environ.py), writable
        a += ["--bind", cache, cache]
    copies = _COPIES.setdefault(state_dir, ConfigCopies(state_dir))
    # Git's own config, sanitised (no credentials, no host programs): the originals stay unseen.
    system = copies.system_config(home) if rules.home else None
    if system:
        a += ["--ro-bind", system, "/etc/gitconfig"]
    if has_home:
        a += _global_git_config(copies, project, home, visible, state_dir)
        # The home's denied paths (~/.ssh, ~/.aws, …) are absent from its view; shown as
        # placeholders instead, a step that looks for them is told why they are not there.
        for p, entry in _hidden_in_home(rules, visible):
            a += ["--ro-bind", masks.cover(p, entry, where_of(entry), follow=True), p]
        a += ["--remount-ro", home]      # the home view is read-only (not the cache bound in it)

    # Read-only inside the writable project, their parents pinned in place first.
    rs = for_project(project).find(rules, scan)
    scan.routes = rs                     # what the daemon fingerprints before the step
    protected = _protected(rules, rs)
    v.protected = protected              # the VM tier's write-back refuses the same (vm/sync.py)
    # A second name (hard link) of a protected file would be a writable way to it: broken away.
    for p in unshare_links(protected):
        print(f"envgit: {p} had another name (a hard link); it now has an inode of its own",
              file=sys.stderr, flush=True)
    configs = {os.path.realpath(c) for c in rs.configs}
    hits: dict[str, str] = {}            # masked path -> the deny entry naming it by itself
    denied = _denied_paths(rules, rs, state_dir, hits)
    # The directories above a denied path are pinned too: renaming one (`mv secrets s2`) would
    # carry the mask away inside the sandbox and leave the person's file, on the host, at a
    # name no deny matches, for the snapshot and the next step to read.
    pins = _pinned(protected, _writable(rules))
    by_name = [p for p in denied if _by_own_name(rules, p, hits.get(p))]
    pins = sorted(set(pins) | set(_pinned([p for p in denied if p not in by_name], _writable(rules)))
                  | set(_scan_blind_spots(rs) if by_name else ()))
    for d in pins:
        a += ["--bind", d, d]
    for p in protected:
        src = p
        if p in configs and os.path.isfile(p):
            src = copies.repo_config(p, os.path.dirname(p), home) or _empty_config(state_dir)
        elif os.path.basename(p) == ".npmrc" and os.path.isfile(p):
            src = _npmrc_copy(p, state_dir) or p
        a += ["--ro-bind", src, p]
    a += ["--ro-bind", blank_dir, os.path.join(project, ".envgit")]

    # Denies, last so they cover every bind above: each by a placeholder of its own (masks.py).
    for p in denied:
        rule = hits.get(p) or ALIAS_RULE
        a += ["--ro-bind", masks.cover(p, rule, where_of(rule)), p]
        v.masked.append(p)
    return v


def _resolv_conf(state_dir):
    """/etc/resolv.conf naming the step's own resolver (resolver.py: 127.0.0.1, answered
    "does not exist" and recorded). Bound where the host's file really is: on a host where
    it is a symlink into /run (systemd-resolved), the sandbox's /run is an empty tmpfs and bwrap
    makes the parents there."""
    from .resolver import RESOLV_CONF
    path = os.path.join(state_dir, "sandbox", "resolv.conf")
    try:
        with open(path) as f:
            current = f.read() == RESOLV_CONF
    except OSError:
        current = False
    if not current:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, RESOLV_CONF, chmod=0o644, sync=False)
    where = os.path.realpath("/etc/resolv.conf")
    if not (where == "/etc/resolv.conf" and os.path.isfile(where)) and not _inside(where, "/run"):
        return []                 # somewhere the sandbox cannot be given a file: leave it
    return ["--ro-bind", path, where]


def _global_git_config(copies, project, home, visible, state_dir):
    """The sanitised global config at ~/.gitconfig; where the real ~/.gitconfig or
    ~/.config/git/config is shown (allow_read of ~ or ~/.config), covered: the first by the
    copy, the second by an empty file (the copy holds both). Git dies on an unreadable config
    file, so these are readable, unlike the deny masks."""
    empty = _empty_config(state_dir)
    cfg = copies.global_config(project, home) or empty
    xdg = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "git", "config")
    first = os.path.join(home, ".gitconfig")
    def shown(p):
        return any(_inside(p, v) for v in visible)
    out = []
    has = os.path.exists(first) or os.path.exists(xdg) or os.path.getsize(cfg) > 0
    if has and (not shown(first) or os.path.exists(first)):
        out += ["--ro-bind", cfg, first]
    if shown(xdg) and os.path.exists(xdg):
        out += ["--ro-bind", empty, xdg]
    return out


def _empty_config(state_dir):
    """A readable empty file, shown for a git config that could not be read safely."""
    empty = os.path.join(state_dir, "sandbox", "empty-config")
    if not os.path.exists(empty):
        open(empty, "w").close()
        os.chmod(empty, 0o644)
    return empty


def _covered(p):
    top = p.lstrip("/").split("/", 1)[0]
    return top in SYSTEM_DIRS and p.count("/") > 1


def _outermost(paths):
    out = []
    for p in sorted(set(paths)):
        if not any(_inside(p, q) for q in out):
            out.append(p)
    return out


def _expand(p):
    return sorted(globmod.glob(p)) if has_magic(p) else [p]


def _sentinels(state_dir):
    """The readable empty directory shown in place of .envgit/."""
    blank_dir = os.path.join(state_dir, "sandbox", "blank")
    os.makedirs(blank_dir, exist_ok=True)
    os.chmod(blank_dir, 0o555)
    return blank_dir


MAX_HOME_HIDDEN = 32        # denied paths of the home shown as placeholders in one view


def _hidden_in_home(rules: Rules, visible):
    """[(path, deny entry)]: the denied paths of the home that exist on the host, with nothing
    the view shows inside or above them (those are masked with the rest, at the end)."""
    out: list[tuple[str, str]] = []
    home = rules.home
    for entry, name in rules.deny_abs:
        for p in _expand(entry):
            if len(out) >= MAX_HOME_HIDDEN:
                return out
            if _inside(p, home) and p != home and os.path.lexists(p) \
                    and not any(_inside(p, q) or _inside(q, p) for q in visible) \
                    and not any(_inside(p, q) for q, _ in out) and is_denied(rules, p):
                out.append((p, name))
    return out


def _protected(rules: Rules, rs):
    """The protected paths to bind read-only, resolved: a symlinked component leads to what it
    names (protected if that is writable, left alone if it is outside every writable area,
    where nothing can be written anyway), and nothing is created through a symlink."""
    writable = _writable(rules)
    out = []
    for p in rs.protect:
        real = os.path.realpath(p)
        if not any(_inside(real, w) for w in writable):
            continue
        if not os.path.lexists(real) and (p in rs.hook_dirs or p.endswith("/hooks") and
                                          os.path.isdir(os.path.dirname(real))):
            os.makedirs(real, exist_ok=True)   # an absent hooks dir would be creatable inside
        if os.path.lexists(real) and not os.path.islink(real):
            out.append(real)
    return _outermost(out)


def _writable(rules: Rules):
    return [rules.project] + [w for w, _ in rules.write_abs]


def _pinned(protected, writable):
    """Every directory between a writable root and a protected or denied path, to bind onto
    itself: a mount point cannot be renamed or removed (EBUSY), so `mv .git .g && mkdir .git`
    cannot carry the protections away with the old directory and leave a writable copy in its
    place, nor `mv secrets s2` carry a deny's mask away from the file it covers."""
    out = set()
    for p in protected:
        roots = [w for w in writable if _inside(p, w)]
        if not roots:
            continue
        root = max(roots, key=len)
        d = os.path.dirname(p)
        while d != root and _inside(d, root):
            out.add(d)
            d = os.path.dirname(d)
    return sorted(out)          # a parent sorts before its children: bound first


def _scan_blind_spots(rs):
    """The directories the project scan never enters (projectscan.py: a repository's
    `objects`), bound onto themselves so that nothing can be moved into them (a rename across
    mounts fails: EXDEV, and mv's copy cannot read a mask): `mv svc .git/objects/ab` would
    otherwise take svc/.env where no glob deny finds it again."""
    dirs = {os.path.join(os.path.dirname(c), "objects") for c in rs.configs}
    return [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]


def _by_own_name(rules, p, entry):
    """Is masked `p` denied by its own name alone, wherever its directories go (`**/.env`,
    `**/*.pem`)? Then moving them frees nothing (the next view masks it at its new place, the
    diff withholds it there) and they need no pin: a project with 200 .env files would
    otherwise pay ~200 binds a step. Not so for `secrets/**` or `config/master.key`, for an
    alias (no deny names it), nor when an allow_read entry other than a `**/name` one could
    be renamed into (`mv app fixtures` under `allow_read: [fixtures/.env]`)."""
    if not entry or not entry.startswith("**/") or "/" in entry[3:] or os.path.realpath(p) != p \
            or not _rel_match(entry, os.path.basename(p)):
        return False
    return not (any(not (e.startswith("**/") and "/" not in e[3:]) for e, _ in rules.allow_rel)
                or any(_inside(e, w) for e, _ in rules.allow_abs for w in _writable(rules)))


def _denied_paths(rules: Rules, rs, state_dir, hits):
    """The paths to mask; `hits` is filled with {path: the deny entry naming it}."""
    out = []
    for entry, _ in rules.deny_abs:
        for p in _expand(entry):
            if os.path.lexists(p) and _visible(rules, p) and (hit := is_denied(rules, p)):
                out.append(p)
                hits[p] = hit
    for p in rs.deny_hits:
        if hit := is_denied(rules, p):
            out.append(p)
            hits[p] = hit
    names = out
    out = [m for m in (_mask_point(rules, p) for p in out) if m]
    # *.pem / *.key: only those holding a private key (a CA bundle stays readable)
    for p in rs.content_hits:
        rel = os.path.relpath(p, rules.project)
        for pattern, marker in defaults.DENY_READ_IF_CONTAINS.items():
            if _rel_match(pattern, rel) and os.path.isfile(p) and not os.path.islink(p) \
                    and has_private_key(p, marker) and not _allowed(rules, p):
                out.append(p)
                hits[p] = pattern
    return _outermost(out + _aliases(rules, names, _outermost(out), state_dir))


def _aliases(rules, names, denied, state_dir):
    """The other names of denied files (sandbox/aliases.py): found now (what a denied name
    leads to through a symlink, at its end or a directory in front of it; a hard link) or
    recorded by an earlier step's view, masked while the same file is there."""
    writable = _writable(rules)
    known = aliases.load(state_dir)
    found = {}
    for p in names:
        real = os.path.realpath(p)
        if real != p and any(_inside(real, w) for w in writable):
            try:
                st = os.lstat(real)
            except OSError:
                continue
            found[real] = (st.st_dev, st.st_ino)
    found.update(_other_names(denied, writable, known))
    aliases.record(state_dir, known, found)
    return [p for p, ident in known.items() if aliases.still_there(p, ident) and _visible(rules, p)]


MAX_DENIED_WALK = 5000      # files looked at under one denied directory for a second name


def _other_names(denied, writable, known):
    """The other names (hard links) of denied files in the writable areas, to be masked too.
    A step can make `secrets/token.txt` and a link `notes.txt` to it while the name is still
    empty; when the person later writes the secret into the denied name in place, the link
    shows it. Only a file with more names than are already `known` starts the search, which
    then lists every directory of the writable areas once (scandir gives the inode without a
    stat per file). Returns {other name: (dev, ino)}."""
    wanted = {}                                # (dev, ino) -> the denied name
    for p in denied:
        if not any(_inside(p, w) for w in writable):
            continue
        for f in _files_of(p):
            try:
                st = os.lstat(f)
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 + sum(1 for q, i in known.items() if i == ident and q != f) \
                    and stat.S_ISREG(st.st_mode):
                wanted[ident] = f
    if not wanted:
        return {}
    inodes = {ino for _, ino in wanted}
    found, stack = {}, [w for w in writable if os.path.isdir(w)]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != ".envgit" and not any(_inside(e.path, p) for p in denied):
                    stack.append(e.path)
            elif e.inode() in inodes and e.path not in wanted.values():
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                first = wanted.get((st.st_dev, st.st_ino))
                if first:
                    found[e.path] = (st.st_dev, st.st_ino)
                    print(f"envgit: {e.path} is another name (a hard link) of {first}, which the "
                          f"policy denies: it is hidden from steps too", file=sys.stderr, flush=True)
    return found


def _files_of(p):
    """`p`, or the files under it when it is a directory (bounded)."""
    if not os.path.isdir(p) or os.path.islink(p):
        return [p]
    out: list[str] = []
    for d, _, files in os.walk(p):
        # bounded by the file, not by the directory: one directory of 200,000 files would
        # otherwise be stat'ed whole by every view
        out += [os.path.join(d, n) for n in files[:MAX_DENIED_WALK - len(out)]]
        if len(out) >= MAX_DENIED_WALK:
            break
    return out


def _mask_point(rules: Rules, p):
    """Where to bind the empty placeholder that masks `p`, or None. bwrap follows a symlink at
    a bind's destination and creates what is missing there, so binding at a link a step left
    (`ln -s /nonexistent/x .envrc`) fails the sandbox's start for every later step, and a link
    to a directory would get a file bound onto a directory. A link is therefore masked at what
    it resolves to, typed by that (what its name holds is what is read through it), and a
    dangling one, or one leading to nothing the sandbox shows, is left as it is: nothing can be
    read through it. Its appearing on a route is marked like any change (routes.fingerprint).
    A link to a *directory* outside the writable areas is left too: masking it would take that
    directory from every later step's view (`a/.env -> /etc`: no /etc/passwd, a placeholder
    gitconfig), and nothing is read through it that the step cannot read by its own path."""
    if not os.path.islink(p):
        return p
    real = os.path.realpath(p)
    if os.path.lexists(real) and not os.path.islink(real) and _visible(rules, real):
        if os.path.isdir(real) and not any(_inside(real, w) for w in _writable(rules)):
            return None
        return real
    return None


def _rel_match(pattern, rel):
    from ..policy.decide import _rx
    return _rx(pattern).match(rel) is not None


def _allowed(rules, p):
    """An allow_read entry naming the path itself lifts a content deny too."""
    from ..policy.decide import _deepest, _rel
    depth, _ = _deepest(rules, p, _rel(rules.project, p), rules.allow_abs, rules.allow_rel)
    return depth >= p.count("/")


_NPM_AUTH = ("_authtoken", "_auth", "_password", "password", "certfile", "keyfile", "cert", "key")


def _npmrc_copy(path, state_dir):
    """A project .npmrc without credentials written in it (a `${NPM_TOKEN}` reference is kept:
    npm fills it from the step's environment, which holds no token unless passed)."""
    try:
        with open(path, "rb") as f:
            lines = f.read(1 << 20).decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return None
    keep, dropped = [], False
    for line in lines:
        k, eq, v = line.partition("=")
        name = k.strip().rsplit(":", 1)[-1].lower()
        if eq and name in _NPM_AUTH and not v.strip().startswith("${"):
            dropped = True
            continue
        keep.append(line)
    if not dropped:
        return None
    import hashlib
    d = os.path.join(state_dir, "sandbox", "npmrc")
    os.makedirs(d, mode=0o700, exist_ok=True)
    out = os.path.join(d, hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16])
    write_atomic(out, "\n".join(keep) + "\n", chmod=0o644, sync=False)
    return out


def _visible(rules, p):
    top = p.lstrip("/").split("/", 1)[0]
    return (top in SYSTEM_DIRS or _inside(p, rules.project)
            or any(_inside(p, q) for q, _ in rules.allow_abs + rules.write_abs))
