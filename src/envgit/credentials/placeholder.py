"""Placeholders: what a step sees instead of each real credential. One per credential and
session (this daemon process), random, shaped like the real thing so a client accepts it: a
GitHub token keeps its `ghp_` prefix and length, an npm token its `npm_` form, an AWS key id
its `AKIA` form. A placeholder is worthless outside: only this session's gate knows it.
"""

import secrets
import string

_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits


def _random(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def kind_of(name: str, cred: dict) -> str:
    """github | npm | aws | generic: which client shape the placeholder takes."""
    source = cred["from"]
    if "profile" in source:
        return "aws"
    words = " ".join([name, *source.values(), *cred["hosts"]]).lower()
    if "github" in words or "gh_token" in words:
        return "github"
    if "npm" in words:
        return "npm"
    return "generic"


def make(kind: str) -> dict[str, str]:
    """{"token": …} or, for AWS, {"key_id": …, "secret": …, "session": …}."""
    if kind == "github":
        return {"token": "ghp_" + _random(_ALNUM, 36)}
    if kind == "npm":
        return {"token": "npm_" + _random(_ALNUM, 36)}
    if kind == "aws":
        return {"key_id": "AKIA" + _random(_UPPER, 16), "secret": _random(_ALNUM, 40),
                "session": "envgitPH" + _random(_ALNUM, 56)}
    return {"token": "envgit_ph_" + _random(_ALNUM, 32)}


class Placeholders:
    """name -> placeholder values, made on first use and kept for the session."""

    def __init__(self):
        self._made: dict[tuple, dict[str, str]] = {}

    def of(self, name: str, cred: dict) -> dict[str, str]:
        key = (name, kind_of(name, cred))
        if key not in self._made:
            self._made[key] = make(key[1])
        return self._made[key]

    def all(self, policy) -> dict[str, dict[str, str]]:
        return {name: self.of(name, cred) for name, cred in policy.credentials.items()}


SESSION = Placeholders()        # the daemon is the session: one set for its life
