"""The environment a step starts with: only what the policy passes, never a token by accident."""

import fnmatch

from ..policy import defaults


def looks_secret(name: str) -> bool:
    up = name.upper()
    return any(fnmatch.fnmatchcase(up, g) for g in defaults.SECRET_NAME_GLOBS)


def scrub(host_env: dict, passes: list[str], sets: dict, extra: dict) -> dict:
    """`passes` may hold globs (LC_*); a secret-looking variable passes only by exact name."""
    exact = {p for p in passes if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in passes if p.endswith("*"))
    out = {}
    for k, v in host_env.items():
        if k in exact or (k.startswith(prefixes) and prefixes and not looks_secret(k)):
            out[k] = v
    out.update(sets)
    out.update(extra)
    return out
