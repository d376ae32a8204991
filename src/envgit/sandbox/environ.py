"""The environment a step starts with: only what the policy passes, never a token by accident."""

import fnmatch
import hashlib
import os
import secrets
import stat

from ..paths import inside as _inside
from ..policy import defaults


def looks_secret(name: str, value: str = "") -> bool:
    """A secret-looking name (SECRET_NAME_GLOBS), or a value that is one whatever its name: a
    URL with a password in it (postgres://u:p@h), a well-known token prefix (ghp_, AKIA, …)."""
    up = name.upper()
    if any(fnmatch.fnmatchcase(up, g) for g in defaults.SECRET_NAME_GLOBS):
        return True
    return _secret_value(value)


def _secret_value(value: str) -> bool:
    v = value.strip()
    if not v:
        return False
    scheme, sep, rest = v.partition("://")
    if sep and scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        userinfo, at, _ = rest.partition("/")[0].rpartition("@")
        if at and ":" in userinfo:
            return True
    return any(w.startswith(defaults.SECRET_VALUE_PREFIXES) and len(w) >= 16
               for w in v.replace(",", " ").replace(";", " ").split())


def scrub(host_env: dict, passes: list[str], sets: dict, extra: dict) -> dict:
    """`passes` may hold globs (LC_*); a secret-looking variable passes only by exact name."""
    exact = {p for p in passes if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in passes if p.endswith("*"))
    out = {}
    for k, v in host_env.items():
        if k in exact or (k.startswith(prefixes) and prefixes and not looks_secret(k, v)):
            out[k] = v
    out.update(sets)
    out.update(extra)
    return out


# --- credentials ------------------------------------------------------------------------------
#
# A step never gets a credential's real value: it gets the session's placeholder
# (credentials/placeholder.py) where its clients look, and the gate swaps the real value in on
# the way out to the credential's hosts (proxy/credentials.py). Git's helper is set through
# git's environment config (GIT_CONFIG_COUNT/KEY_n/VALUE_n), never by writing a config file.

def credential_env(policy, env: dict, session_tmp: str | None = None) -> dict[str, str]:
    """The variables to add to a step's environment `env` for the policy's credentials.
    With `session_tmp` (the host directory that is the step's /tmp), npm's per-registry
    tokens also go in a user config file there: a shell drops the `npm_config_//host/:…`
    variables (not shell names) before npm sees them. (The person's ~/.npmrc is unreadable
    inside anyway: a default deny.)"""
    creds = getattr(policy, "credentials", None)
    if not creds:
        return {}
    from ..credentials.placeholder import SESSION, kind_of
    out: dict[str, str] = {}
    git: list[tuple[str, str]] = []
    npmrc: list[str] = []
    for name, cred in creds.items():
        ph, kind = SESSION.of(name, cred), kind_of(name, cred)
        if kind == "aws":
            out.update(AWS_ACCESS_KEY_ID=ph["key_id"], AWS_SECRET_ACCESS_KEY=ph["secret"])
            continue
        token = ph["token"]
        out["ENVGIT_CREDENTIAL_" + name.upper()] = token
        if "env" in cred["from"]:
            out[cred["from"]["env"]] = token
        if kind == "github":
            out.update(GITHUB_TOKEN=token, GH_TOKEN=token)
        if kind == "npm":
            out.setdefault("NPM_TOKEN", token)
        for host in cred["hosts"]:
            if kind != "github":
                # npm reads `//host/:_authToken` from npm_config_… without renaming it.
                out[f"npm_config_//{host}/:_authToken"] = token
                npmrc.append(f"//{host}/:_authToken={token}\n")
            url = f"https://{host}"
            git.append((f"credential.{url}.helper", ""))       # only ours for this host
            git.append((f"credential.{url}.helper",
                        f"!f() {{ test \"$1\" = get && printf 'username=x-access-token\\npassword=%s\\n' "
                        f"'{token}'; }}; f"))
    if npmrc and session_tmp and "npm_config_userconfig" not in env:
        # The session's /tmp is the steps' to write: a FIFO or link left at the name is
        # replaced, never opened (atomicfile.py).
        from ..atomicfile import write_atomic
        write_atomic(os.path.join(session_tmp, ".envgit-npmrc"), "".join(npmrc), 0o600, sync=False)
        out["npm_config_userconfig"] = "/tmp/.envgit-npmrc"
    if git:
        try:
            n = int(env.get("GIT_CONFIG_COUNT", "0"))
        except ValueError:
            n = 0
        for i, (k, v) in enumerate(git, start=n):
            out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = k, v
        out["GIT_CONFIG_COUNT"] = str(n + len(git))
    return out


def withhold_real_values(policy, env: dict, host_env: dict) -> list[str]:
    """A variable of `env` (what `env.pass` let in) holding a credential's real value, under
    any name (the same token is often set twice: GITHUB_TOKEN and GH_TOKEN, MY_TOKEN and a
    DEPLOY_TOKEN): the real value is replaced by the credential's placeholder in place (the
    gate swaps it back on the way to the credential's hosts), or, for an AWS session token,
    which has no placeholder, the variable is dropped. Changes `env`; returns the names
    changed, for the step's record. Real values are read as the gate reads them (env, file,
    profile; from both the person's environment of this run and the session's); a `command`
    source is not run at step start."""
    creds = getattr(policy, "credentials", None)
    if not creds:
        return []
    from ..credentials.placeholder import SESSION
    from ..credentials.source import CredentialError, read
    pairs: list[tuple[str, str | None]] = []        # (real value, its placeholder or None)
    for name, cred in creds.items():
        if next(iter(cred["from"]), "") == "command":
            continue
        placeholders = SESSION.of(name, cred)
        for environ in (host_env, os.environ):
            try:
                reals = read(name, cred["from"], environ)
            except (CredentialError, OSError, ValueError):
                continue
            pairs += [(v, placeholders.get(k)) for k, v in reals.items() if len(v) >= MIN_REAL]
    changed = []
    for var, value in list(env.items()):
        new = value
        for real, ph in pairs:
            if real in new:
                new = new.replace(real, ph) if ph is not None else None
                if new is None:
                    break
        if new != value:
            changed.append(var)
            if new is None:
                del env[var]
            else:
                env[var] = new
    return changed


MIN_REAL = 8            # a shorter value is not looked for (as the gate: proxy/credentials.py)


# --- package caches ---------------------------------------------------------------------------
#
# Each project has one cache directory, outside it and outside the host's own caches:
# $XDG_CACHE_HOME/envgit/<name>-<id> (~/.cache/envgit/…), the daemon's own environment deciding
# where (never a step's). It is bound writable at the same path in every sandbox of the project
# and kept between steps and sessions, so a second `pip install` or `npm install` is not cold.
# The clients find it through their own variables. What it means to trust it: a later step of
# the same project reads what an earlier one wrote (a poisoned wheel, a planted cargo config):
# the trust a step already has in the project itself, whose code (node_modules, .venv, build
# scripts) the next step runs anyway. Nothing on the host reads it: the host's ~/.cache/pip,
# ~/.npm and ~/.cargo are neither shown nor written, and no other project's cache is visible.
# Without a usable place (no home, an XDG_CACHE_HOME inside the project) the caches fall back
# to the step's own /tmp and last one step, as before.
CACHE_VARS = {
    "XDG_CACHE_HOME": "",                       # the directory itself: pip, uv, go-build, …
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "npm_config_cache": "npm",
    "YARN_CACHE_FOLDER": "yarn",
    # pnpm's content-addressed store is $PNPM_HOME/store (an npm_config_store_dir would make
    # every `npm install` warn `Unknown env config "store-dir"`)
    "PNPM_HOME": "pnpm",
    "CARGO_HOME": "cargo",                      # its registry index, .crate files and git checkouts
    "GOPATH": "go",                             # GOMODCACHE (go/pkg/mod) and the sumdb cache
    "GOCACHE": "go-build",
}
_KEY_FILE = "cache-key"


def cache_env(cache: str | None) -> dict[str, str]:
    """The clients' variables pointing into `cache` (None: into the step's /tmp)."""
    base = cache or "/tmp/.cache"
    return {name: os.path.join(base, sub) if sub else base for name, sub in CACHE_VARS.items()}


def project_cache(project: str, state_dir: str, environ=os.environ) -> str | None:
    """This project's cache directory on the host (created, mode 0700), or None."""
    root = environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(root):
        home = environ.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home) or home == "/":
            return None
        root = os.path.join(home, ".cache")
    if not os.path.isdir(os.path.dirname(os.path.normpath(root))):
        return None                 # a home that does not exist is not made here
    root = os.path.normpath(os.path.join(root, "envgit"))
    project = os.path.realpath(project)
    real = os.path.realpath(root)
    if _inside(real, project) or _inside(project, real):
        return None                 # a cache a step could reach as project files, or the reverse
    try:
        key = _project_key(state_dir)
        os.makedirs(root, mode=0o700, exist_ok=True)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(project))
        digest = hashlib.sha256(f"{project}\0{key}".encode("utf-8", "surrogateescape")).hexdigest()
        path = os.path.join(root, f"{name[:32].lstrip('.') or 'project'}-{digest[:16]}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return path
    except OSError:
        return None


def _project_key(state_dir: str) -> str:
    """A random key kept in .envgit/ (which no step sees): with the project's path it names
    the cache, so a copy of the project elsewhere, or a new project made where an old one
    was, starts with a cache of its own."""
    path = os.path.join(state_dir, _KEY_FILE)
    try:
        with open(path) as f:
            key = f.read().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_hex(16)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    try:
        os.link(tmp, path)          # the first writer wins; a racing one reads its key
    except FileExistsError:
        with open(path) as f:
            key = f.read().strip()
    finally:
        os.unlink(tmp)
    return key


