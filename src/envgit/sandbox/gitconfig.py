"""Git configuration as a step sees it: a sanitised copy, never the person's file as it is.

Git's config holds credentials (`url.<base>.insteadOf` with a token in the base, remote URLs
with a password, `http.extraHeader: AUTHORIZATION: basic …` written by CI checkouts,
`credential.*` helpers) and names host programs (`core.fsmonitor`, `core.sshCommand`,
`!` aliases, `diff.external`, `*.textconv`). A step gets the same configuration with those
removed, as files under the state directory bound read-only where git looks:
  the system config   over /etc/gitconfig (when there is one), includes folded in
  the global config   at ~/.gitconfig inside the empty home (~/.gitconfig, ~/.config/git/config
                      and what they include, folded; the originals are not shown)
  a repository's      over its .git/config (the project's, nested ones, submodules'), that one
                      file only: its `include.path`/`includeIf` keys are kept, not resolved, so
                      git inside the step follows them in the step's own view (what the step
                      cannot read there, git skips). A step can write or redirect a repository
                      config (`.git/commondir`, a `.git` file), so the daemon never resolves
                      its includes on the host: `[include] path = ~/.my.cnf` would otherwise
                      fold a host-only file into a copy the step reads.

Kept on purpose: filter drivers (`filter.*.clean/smudge/process`: without its clean filter
`git add` would store what the filter exists to keep out, e.g. git-crypt's plaintext or an LFS
object instead of its pointer), pager and editor (they run inside the sandbox, like the step).

Git itself reads the files (`git config --list -z`, hostgit.py: a trusted binary, `git config`
and nothing else), so quoting and continuation lines are read as git reads them; each copy is
rewritten only when a source changed.
"""

import hashlib
import os
import re

from ..policy import defaults
from . import hostgit
from .hostgit import GIT_TIMEOUT_S  # noqa: F401  (kept for importers)

# Keys dropped whole: credentials, and host integrations a sandboxed git must not start.
_DROP = re.compile(r"""(
      credential\..*
    | http\.(.*\.)?(extraheader|cookiefile|sslkey|sslcert|sslcertpasswordprotected|proxysslkey|proxysslcert)
    | core\.(fsmonitor|sshcommand|askpass)
    | ssh\.variant
    | diff\.external | diff\..*\.(textconv|command) | .*\.textconv
    | sendemail\.smtppass | .*\.(token|oauthtoken|accesstoken|password|secret|apikey|api-key)
)\Z""", re.X | re.I)

# userinfo in a URL: scheme://USER[:PASS]@host
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s]+)@")


def _strip_userinfo(text: str) -> str:
    """A URL's user and password removed (an `ssh://git@` user without a password is kept)."""
    def repl(m):
        scheme, info = m.group(1), m.group(2)
        if scheme.lower().startswith("ssh") and ":" not in info:
            return m.group(0)
        return scheme
    return _USERINFO.sub(repl, text)


def _secret_value(value: str) -> bool:
    v = value.strip()
    for word in v.replace(":", " ").split():
        if word.startswith(defaults.SECRET_VALUE_PREFIXES) and len(word) >= 16:
            return True
    return v.lower().startswith(("authorization:", "bearer ", "basic ", "token "))


_INCLUDE = re.compile(r"(include|includeif\..*)\.path\Z", re.I)


def sanitise(entries, keep_includes: bool = False):
    """[(key, value or None)] with credentials and host-program keys removed; include keys
    too, unless `keep_includes` (a repository's copy: git in the step follows them)."""
    out = []
    for key, value in entries:
        if _DROP.match(key):
            continue
        if key.lower().startswith(("include.", "includeif.")) and \
                not (keep_includes and _INCLUDE.match(key)):
            continue
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        if "@" in sub and _strip_userinfo(sub) != sub:
            continue                # url.https://TOKEN@host/.insteadof: the token is the key
        if section.lower() == "alias" and value is not None and value.lstrip().startswith("!"):
            continue                # a shell snippet written for the host (and often a token)
        if value is not None:
            if _secret_value(value):
                continue
            value = _strip_userinfo(value)
        out.append((key, value))
    return out


def render(entries) -> str:
    """Entries back as a config file git reads: one [section "sub"] per run of keys."""
    lines, current = [], None
    for key, value in entries:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        head = (section, sub)
        if head != current:
            if sub:
                esc = sub.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'[{section} "{esc}"]')
            else:
                lines.append(f"[{section}]")
            current = head
        if value is None:
            lines.append(f"\t{name}")
        else:
            esc = (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                   .replace("\t", "\\t"))
            lines.append(f'\t{name} = "{esc}"')
    return "\n".join(lines) + ("\n" if lines else "")


def read(args, cwd, env) -> list | None:
    """`git config ARGS --list -z` as [(key, value or None)]; None if git could not say."""
    out = hostgit.config_list(args, cwd, env if env is not None else
                              hostgit.base_env(os.path.expanduser("~")))
    return None if out is None else hostgit.parse(out)


def git_env(home: str) -> dict:
    """The environment git reads the person's config with (hostgit.person_env)."""
    return hostgit.person_env(home)


class ConfigCopies:
    """The sanitised copies, made under `state_dir/sandbox/git/`, remade when a source changed."""

    def __init__(self, state_dir: str):
        self.dir = os.path.join(state_dir, "sandbox", "git")
        self._made: dict[str, tuple] = {}      # copy path -> key of the sources it was made from

    def _write(self, name, key, entries_fn, keep_includes=False) -> str | None:
        path = os.path.join(self.dir, name)
        if self._made.get(path) == key and os.path.exists(path):
            return path
        entries = entries_fn()
        if entries is None:
            return None
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(render(sanitise(entries, keep_includes)))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        self._made[path] = key
        return path

    def repo_config(self, config: str, cwd: str, home: str) -> str | None:
        """A sanitised copy of the repository config file `config`: that file alone, its
        includes kept as keys for git inside the step to follow (never resolved here)."""
        name = "repo-" + hashlib.sha256(config.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return self._write(name, _stamps([config]),
                           lambda: hostgit.file_entries(config, home), keep_includes=True)

    def global_config(self, project: str, home: str) -> str | None:
        """The person's global config (~/.gitconfig, XDG, includes), sanitised."""
        env = git_env(home)
        xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        sources = [os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"),
                   env.get("GIT_CONFIG_GLOBAL", "")]
        return self._write("global", _stamps(sources + [project]),
                           lambda: _entries(hostgit.person_config("--global", project, home)))

    def system_config(self, home: str) -> str | None:
        if not os.path.isfile("/etc/gitconfig"):
            return None
        return self._write("system", _stamps(["/etc/gitconfig"]),
                           lambda: _entries(hostgit.person_config("--system", "/", home)))


def _entries(out):
    return None if out is None else hostgit.parse(out)


def _stamps(paths):
    out = []
    for p in paths:
        try:
            st = os.stat(p) if p else None
        except OSError:
            st = None
        out.append((p, st and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
    return tuple(out)
