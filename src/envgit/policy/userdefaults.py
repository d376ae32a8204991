"""A person's own defaults: `$XDG_CONFIG_HOME/envgit/policy.yaml` (else
`~/.config/envgit/policy.yaml`), in the format of envgit.yaml, merged UNDER every project's
file: the presets, hosts, variables and irreversible rules a person allows everywhere, written
once. The project's file is read over it (a list gets the person's entries and the project's;
a single value is the project's when it has one), and the organisation policy binds the result
exactly as it binds a project's values (orgmerge.combine sees them as the project's, each with
the person's file:line). docs/POLICY.md "Your own defaults" has the table, key by key.

Its trust: the person's own file, outside every project. A step must not be able to write it
(it would widen every later step of every project): the sandbox's home is an empty read-only
view, and load.py refuses any allow_write that would bring this directory into a step's view
(`check_unwritable`); the file may not lie inside the project, nor be writable by anyone but
its owner (the person or root). Who reads the variable: the daemon, from the environment of the
person's `envgit run` that started it, and `envgit policy`, as org.py's variable.
"""

import os
import stat

from .schema import PolicyError, where_line

USER_POLICY = os.path.join("envgit", "policy.yaml")


def config_dir(environ=None, home=None) -> str:
    """Where the person's envgit configuration lives: $XDG_CONFIG_HOME/envgit when that is an
    absolute path (the XDG rule: a relative one is ignored), else ~/.config/envgit."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(xdg):
        xdg = os.path.join(home or os.path.expanduser("~"), ".config")
    return os.path.join(xdg, "envgit")


def path(environ=None) -> str:
    return os.path.join(config_dir(environ), "policy.yaml")


def locate(project_root: str, environ=None) -> str | None:
    """The person's defaults file, or None when there is none. Raises PolicyError when it is
    there but cannot be trusted (every step is refused, as for a bad envgit.yaml)."""
    p = path(environ)
    if not os.path.lexists(p):
        return None
    real = os.path.realpath(p)
    root = os.path.realpath(project_root)
    if real == root or real.startswith(root.rstrip("/") + "/"):
        raise PolicyError(p, 0, 0, "your policy defaults lie inside the project, where a step "
                          "can write; keep them in ~/.config/envgit (or unset XDG_CONFIG_HOME)")
    try:
        st = os.stat(real)
    except OSError as e:
        raise PolicyError(p, 0, 0, f"your policy defaults cannot be read ({e.strerror}); fix or "
                          "remove the file") from None
    if not stat.S_ISREG(st.st_mode):
        raise PolicyError(p, 0, 0, "your policy defaults are not a regular file; remove it")
    _owned(p, real, st, "file")
    d = os.path.dirname(real)
    while True:
        _owned(p, d, os.stat(d), "directory")
        if d == "/":
            break
        d = os.path.dirname(d)
    return p


def _owned(p, what, st, kind):
    """Owned by the person or root, writable by no one else (a sticky directory's others-write,
    as /tmp's, and the person's own group are fine)."""
    owners = (0, os.getuid())
    others = st.st_mode & 0o002 and not (kind == "directory" and st.st_mode & stat.S_ISVTX)
    group = st.st_mode & 0o020 and st.st_gid not in (0, os.getgid())
    if st.st_uid not in owners or others or group:
        who = f"owned by uid {st.st_uid}" if st.st_uid not in owners else \
            f"writable by {'everyone' if others else f'group {st.st_gid}'}"
        raise PolicyError(p, 0, 0, f"your policy defaults are refused: {kind} {what} is {who}; it "
                          "must be yours (or root's) and writable only by you (chown, chmod go-w), "
                          "so that no one else can change what every project allows")


def check_unwritable(data: dict, where: dict, home: str, project_root: str, environ=None) -> None:
    """No allow_write entry (of any file) may bring the person's envgit configuration into a
    step's view writable: a step could then write the defaults every later step runs under
    (or plant them where there are none yet). Resolved as decide.resolve does."""
    from .writes import column_of, resolved_writes
    guarded = os.path.normpath(config_dir(environ, home))
    for t, entry, key in resolved_writes(data, home, project_root):
        for g in dict.fromkeys((guarded, os.path.realpath(guarded))):
            if g == t or g.startswith(t.rstrip("/") + "/"):
                f, n = where_line(where.get(key, ""))
                raise PolicyError(f, n, column_of(f, n, entry), f"filesystem.allow_write makes "
                                  f"{entry} writable, which "
                                  f"holds your policy defaults ({guarded}): a step could rewrite "
                                  "what every project allows; remove it (name the directories "
                                  "a step needs, below it or beside it)")


# --- the merge: the person's file under the project's -------------------------------------

# Lists: the person's entries, then the project's (each keeping its file:line).
LISTS = ("filesystem.deny_read", "filesystem.allow_read", "filesystem.allow_write",
         "filesystem.protect", "escape_routes.allow", "env.pass", "env.deny", "network.allow",
         "network.deny", "shell", "snapshot.exclude", "vm.packages")
# Named entries: the person's and the project's; a name both give is the project's.
NAMED = ("env.set", "network.l7", "credentials", "mcp.servers")
# Single values: the project's when it has one, else the person's.
SCALARS = ("network.ask_timeout", "snapshot.max_file_size", "backend", "learn", "degraded_sandbox",
           "signing", "vm.memory", "vm.cpus", "mcp.max_return_bytes", "mcp.flag_bytes_in",
           "mcp.flag_bytes_out")


def _get(d, dotted):
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _put(d, dotted, value):
    *parents, last = dotted.split(".")
    for k in parents:
        d = d.setdefault(k, {})
    d[last] = value


def _copy_where(dst: dict, src: dict, old: str, new: str) -> None:
    """Every provenance entry of `old` and below it (`old.x`, `old[i]`), as `new`."""
    for k, v in src.items():
        if k == old or k.startswith(old + ".") or k.startswith(old + "["):
            dst[new + k[len(old):]] = v


def combine(user: dict, uwhere: dict, proj: dict, pwhere: dict) -> tuple[dict, dict]:
    """(data, where) of the project's file read over the person's defaults, in the shape
    `validate` returns: what orgmerge.combine and load._merge take as the project's."""
    from .hostentries import ORG_KEY
    if ORG_KEY in uwhere:
        f, n = where_line(uwhere[ORG_KEY])
        raise PolicyError(f, n, 1, f"{ORG_KEY} is read from the organisation policy only; "
                          "remove it from your defaults")
    data: dict = {"version": 1}
    where: dict = {"version": pwhere.get("version", "")}
    for key in LISTS:
        u, p = _get(user, key), _get(proj, key)
        if u is None and p is None:
            continue
        items: list = []
        for w, values in ((uwhere, u or []), (pwhere, p or [])):
            for i, v in enumerate(values):
                _copy_where(where, w, f"{key}[{i}]", f"{key}[{len(items)}]")
                items.append(v)
        _put(data, key, items)
        where[key] = _both(uwhere.get(key), pwhere.get(key))
    for key in NAMED:
        u, p = _get(user, key), _get(proj, key)
        if u is None and p is None:
            continue
        merged = {}
        for w, values in ((uwhere, u or {}), (pwhere, p or {})):
            for name, v in values.items():
                merged[name] = v
                for k in [k for k in where if k == f"{key}.{name}" or k.startswith(f"{key}.{name}.")]:
                    del where[k]        # the person's entry of that name, replaced whole
                _copy_where(where, w, f"{key}.{name}", f"{key}.{name}")
        _put(data, key, merged)
        where[key] = _both(uwhere.get(key), pwhere.get(key))
    for key in SCALARS:
        u, p = _get(user, key), _get(proj, key)
        if p is not None:
            _put(data, key, p)
            where[key] = pwhere[key]
        elif u is not None:
            _put(data, key, u)
            where[key] = uwhere[key]
    # Published ports are a project's: a host port serves one project's steps at a time.
    if _get(user, "network.publish") is not None:
        f, n = where_line(uwhere["network.publish"])
        raise PolicyError(f, n, 1, "network.publish is a project's (a host port serves one project's "
                          "steps at a time): remove it from your defaults and name it in the project's "
                          "envgit.yaml, or use `envgit run -p PORT`")
    if _get(proj, "network.publish") is not None:
        _put(data, "network.publish", _get(proj, "network.publish"))
        _copy_where(where, pwhere, "network.publish", "network.publish")
    _irreversible(user, uwhere, proj, pwhere, data, where)
    _mcp_rules(user, uwhere, proj, pwhere, data, where)
    for key in ("mcp", "vm"):           # the sections a scalar above may have left unmarked
        if key in data:
            where.setdefault(key, _both(uwhere.get(key), pwhere.get(key)))
    return data, where


def _both(a, b):
    return f"{a} + {b}" if a and b else a or b or ""


def _irreversible(user, uwhere, proj, pwhere, data, where) -> None:
    """Request (`net:`) rules are tried first match first: the project's, then the person's, so
    a project's rule decides what it matches. Preset entries (`preset:`, `rule:`) are read last
    one winning: the person's, then the project's (or `preset: default` when the project names
    no irreversible list, so a person's `rule: git-push, action: ask` adjusts the default
    preset instead of replacing it)."""
    u = user.get("irreversible")
    if u is None:
        if "irreversible" in proj:
            data["irreversible"] = proj["irreversible"]
            _copy_where(where, pwhere, "irreversible", "irreversible")
        return
    p = proj.get("irreversible")
    pw = pwhere
    if p is None:
        from .defaults import IRREVERSIBLE
        p, pw = [dict(e) for e in IRREVERSIBLE], {f"irreversible[{i}]": "default"
                                                  for i in range(len(IRREVERSIBLE))}
    order = [("p", i) for i, e in enumerate(p) if "net" in e] + \
        [("u", i) for i, e in enumerate(u) if "net" in e] + \
        [("u", i) for i, e in enumerate(u) if "net" not in e] + \
        [("p", i) for i, e in enumerate(p) if "net" not in e]
    out: list = []
    for side, i in order:
        src, w = (u, uwhere) if side == "u" else (p, pw)
        _copy_where(where, w, f"irreversible[{i}]", f"irreversible[{len(out)}]")
        out.append(src[i])
    data["irreversible"] = out
    where["irreversible"] = _both(uwhere.get("irreversible"), pwhere.get("irreversible", "default"))


def _mcp_rules(user, uwhere, proj, pwhere, data, where) -> None:
    """mcp.rules: first match wins, so the project's, then the person's."""
    u, p = _get(user, "mcp.rules"), _get(proj, "mcp.rules")
    if u is None and p is None:
        return
    out: list = []
    for w, values in ((pwhere, p or []), (uwhere, u or [])):
        for i, v in enumerate(values):
            _copy_where(where, w, f"mcp.rules[{i}]", f"mcp.rules[{len(out)}]")
            out.append(v)
    _put(data, "mcp.rules", out)
    where["mcp.rules"] = _both(uwhere.get("mcp.rules"), pwhere.get("mcp.rules"))


def stat_key(environ=None):
    """What changes when the person's defaults do (the daemon re-reads the policy then): the
    stat of the file, after symlinks, or (path, "missing")."""
    p = path(environ)
    try:
        st = os.stat(p)
    except OSError:
        return (p, "missing")
    return (p, st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_mode, st.st_uid)
