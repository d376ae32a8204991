"""The environment a step starts with: only what the policy passes, never a token by accident."""

import fnmatch

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
