"""Git configuration as a step sees it: a sanitised copy, never the person's file as it is.

Git's config holds credentials (`url.<base>.insteadOf` with a token in the base, remote URLs
with a password, `http.extraHeader: AUTHORIZATION: basic …` written by CI checkouts,
`credential.*` helpers) and names host programs (`core.fsmonitor`, `core.sshCommand`,
`!` aliases, `diff.external`, `*.textconv`). A step gets the same configuration with those
removed, flattened (includes resolved, so no included file needs to be visible), as files
under the state directory bound read-only where git looks:
  the system config   over /etc/gitconfig (when there is one)
  the global config   at ~/.gitconfig inside the empty home (~/.gitconfig, ~/.config/git/config
                      and what they include, folded; the originals are not shown)
  a repository's      over its .git/config (the project's, nested ones, submodules')

Kept on purpose: filter drivers (`filter.*.clean/smudge/process`: without its clean filter
`git add` would store what the filter exists to keep out, e.g. git-crypt's plaintext or an LFS
object instead of its pointer), pager and editor (they run inside the sandbox, like the step).

Git itself reads the files (`git config --list -z`), so quoting, continuation lines and
includes are read as git reads them; each copy is rewritten only when a source changed.
"""

import hashlib
import os
import re
import subprocess

from ..policy import defaults

GIT_TIMEOUT_S = 5

# Keys dropped whole: credentials, and host integrations a sandboxed git must not start.
_DROP = re.compile(r"""(
      credential\..*
    | http\.(.*\.)?(extraheader|cookiefile|sslkey|sslcert|sslcertpasswordprotected|proxysslkey|proxysslcert)
    | core\.(fsmonitor|sshcommand|askpass)
    | ssh\.variant
    | diff\.external | diff\..*\.(textconv|command) | .*\.textconv
    | include\..* | includeif\..*
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


def sanitise(entries):
    """[(key, value or None)] with credentials and host-program keys removed."""
    out = []
    for key, value in entries:
        if _DROP.match(key):
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
    try:
        r = subprocess.run(["git", "-c", "safe.directory=*", "config", *args, "--list", "-z"],
                           cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode not in (0, 1):          # 1: nothing set
        return None
    out = []
    for rec in r.stdout.split(b"\0"):
        if not rec:
            continue
        key, nl, value = rec.partition(b"\n")
        out.append((key.decode("utf-8", "surrogateescape"),
                    value.decode("utf-8", "surrogateescape") if nl else None))
    return out


def git_env(home: str) -> dict:
    """The environment git reads the person's config with: their home, and the daemon's own
    XDG/GIT_CONFIG_* settings (inherited from the person's `envgit run` that started it)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LC_ALL": "C",
           "GIT_TERMINAL_PROMPT": "0"}
    for k in ("XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"):
        if k in os.environ:
            env[k] = os.environ[k]
    return env


class ConfigCopies:
    """The sanitised copies, made under `state_dir/sandbox/git/`, remade when a source changed."""

    def __init__(self, state_dir: str):
        self.dir = os.path.join(state_dir, "sandbox", "git")
        self._made: dict[str, tuple] = {}      # copy path -> key of the sources it was made from

    def _write(self, name, key, entries_fn) -> str | None:
        path = os.path.join(self.dir, name)
        if self._made.get(path) == key and os.path.exists(path):
            return path
        entries = entries_fn()
        if entries is None:
            return None
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(render(sanitise(entries)))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        self._made[path] = key
        return path

    def repo_config(self, config: str, cwd: str, home: str) -> str | None:
        """A sanitised copy of the repository config file `config` (includes folded in)."""
        name = "repo-" + hashlib.sha256(config.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        env = {**git_env(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
        return self._write(name, _stamps([config]),
                           lambda: read(["--file", config, "--includes"], os.path.dirname(config), env))

    def global_config(self, project: str, home: str) -> str | None:
        """The person's global config (~/.gitconfig, XDG, includes), sanitised."""
        env = git_env(home)
        xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        sources = [os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"),
                   env.get("GIT_CONFIG_GLOBAL", "")]
        return self._write("global", _stamps(sources + [project]),
                           lambda: read(["--global", "--includes"], project, env))

    def system_config(self, home: str) -> str | None:
        if not os.path.isfile("/etc/gitconfig"):
            return None
        env = git_env(home)
        return self._write("system", _stamps(["/etc/gitconfig"]),
                           lambda: read(["--system", "--includes"], "/", env))


def _stamps(paths):
    out = []
    for p in paths:
        try:
            st = os.stat(p) if p else None
        except OSError:
            st = None
        out.append((p, st and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
    return tuple(out)
