"""The filesystem a step sees, as bwrap arguments.

The view is built from an allow-list, not by hiding things in a copy of `/`:
  /usr /bin /lib* /etc /opt …   read-only (SYSTEM_DIRS), with default denies masked (/etc/shadow)
  /proc /dev                     fresh (pid namespace's own /proc, a minimal /dev)
  /run /var/tmp                  empty tmpfs: no host sockets (docker.sock, dbus, ssh-agent)
  /tmp                           the session's private tmp under .envgit/
  $HOME                          an empty read-only tmpfs, plus allow_read entries (toolchains)
  the project                    writable; envgit.yaml, .git/hooks, .git/config, the
                                 core.hooksPath dir and `protect` read-only; .envgit/ an empty
                                 read-only directory; denied files masked
Bind order matters to bwrap (later mounts cover earlier ones), so the list is built in that order.

A masked path is covered by an empty file or directory with mode 000: reading it fails with
"Permission denied", as an unreadable file would (bwrap drops all capabilities, root included).
"""

import glob as globmod
import os
import re
from dataclasses import dataclass, field

from ..policy import Rules, is_denied
from ..policy.decide import SYSTEM_DIRS
from ..policy.globs import has_magic
from .projectscan import ProjectScan


@dataclass
class View:
    args: list[str] = field(default_factory=list)
    masked: list[str] = field(default_factory=list)   # every path covered by a deny


def build_view(rules: Rules, state_dir: str, session_tmp: str, scan: ProjectScan) -> View:
    v = View()
    a = v.args
    project, home = rules.project, rules.home
    empty_dir, empty_file, blank_dir = _sentinels(state_dir)

    for name in sorted(os.listdir("/")):
        path = "/" + name
        if os.path.islink(path):
            a += ["--symlink", os.readlink(path), path]
        elif name in SYSTEM_DIRS and os.path.isdir(path):
            a += ["--ro-bind", path, path]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run",
          "--dir", "/var", "--tmpfs", "/var/tmp", "--symlink", "../run", "/var/run",
          "--bind", session_tmp, "/tmp"]
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
    if has_home:
        a += ["--remount-ro", home]      # the home view is read-only; caches go to /tmp

    # Read-only inside the writable project, their parents pinned in place first.
    protected = _protected(rules)
    for d in _pinned(protected, _writable(rules)):
        a += ["--bind", d, d]
    for p in protected:
        a += ["--ro-bind", p, p]
    a += ["--ro-bind", blank_dir, os.path.join(project, ".envgit")]

    # Denies, last so they cover every bind above.
    for p in _denied_paths(rules, scan):
        a += ["--ro-bind", empty_dir if os.path.isdir(p) and not os.path.islink(p) else empty_file, p]
        v.masked.append(p)
    return v


def _covered(p):
    top = p.lstrip("/").split("/", 1)[0]
    return top in SYSTEM_DIRS and p.count("/") > 1


def _inside(p, d):
    return p == d or p.startswith(d.rstrip("/") + "/")


def _outermost(paths):
    out = []
    for p in sorted(set(paths)):
        if not any(_inside(p, q) for q in out):
            out.append(p)
    return out


def _expand(p):
    return sorted(globmod.glob(p)) if has_magic(p) else [p]


def _sentinels(state_dir):
    """The mode-000 directory and file that cover denied paths, and the readable empty
    directory shown in place of .envgit/."""
    d = os.path.join(state_dir, "sandbox")
    empty_dir, empty_file, blank_dir = (os.path.join(d, n) for n in ("denied-dir", "denied", "blank"))
    for p, mode in ((empty_dir, 0o000), (blank_dir, 0o555)):
        os.makedirs(p, exist_ok=True)
        os.chmod(p, mode)
    if not os.path.exists(empty_file):
        open(empty_file, "w").close()
    os.chmod(empty_file, 0o000)
    return empty_dir, empty_file, blank_dir


_HOOKS_RE = re.compile(r"^\s*hookspath\s*=\s*(.+?)\s*$", re.I | re.M)


def hooks_path(project: str, home: str) -> str | None:
    """core.hooksPath from the repository's config (then the user's): git runs whatever is
    there on the next commit outside the sandbox, so it must not be writable inside."""
    for cfg in (os.path.join(project, ".git", "config"), os.path.join(home, ".gitconfig")):
        try:
            text = open(cfg, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        m = _HOOKS_RE.findall(text)
        if m:
            value = m[-1].strip('"')
            value = os.path.expanduser(value) if value.startswith("~") else value
            return os.path.normpath(os.path.join(project, value))
    return None


def _protected(rules: Rules):
    """The protected paths to bind read-only, resolved: a symlinked component leads to what it
    names (protected if that is writable, left alone if it is outside every writable area,
    where nothing can be written anyway), and nothing is created through a symlink."""
    project = rules.project
    paths = [x for p, _ in rules.protect_abs for x in _expand(p)]
    hp = hooks_path(project, rules.home)
    if hp:
        paths.append(hp)
    writable = _writable(rules)
    out = []
    for p in paths:
        real = os.path.realpath(p)
        if not any(_inside(real, w) for w in writable):
            continue
        if not os.path.lexists(real) and (p.endswith("/hooks") or p == hp) and \
                os.path.isdir(os.path.dirname(real)):
            os.makedirs(real, exist_ok=True)   # an absent hooks dir would be creatable inside
        if os.path.lexists(real) and not os.path.islink(real):
            out.append(real)
    return _outermost(out)


def _writable(rules: Rules):
    return [rules.project] + [w for w, _ in rules.write_abs]


def _pinned(protected, writable):
    """Every directory between a writable root and a protected path, to bind onto itself: a
    mount point cannot be renamed or removed, so `mv .git .g && mkdir .git` cannot carry the
    protections away with the old directory and leave a writable copy in its place."""
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


def _denied_paths(rules: Rules, scan: ProjectScan):
    out = []
    for entry, _ in rules.deny_abs:
        for p in _expand(entry):
            if os.path.lexists(p) and is_denied(rules, p) and _visible(rules, p):
                out.append(p)
    out += [p for p in scan.matches(rules) if is_denied(rules, p)]
    return _outermost(out)


def _visible(rules, p):
    top = p.lstrip("/").split("/", 1)[0]
    return (top in SYSTEM_DIRS or _inside(p, rules.project)
            or any(_inside(p, q) for q, _ in rules.allow_abs + rules.write_abs))
