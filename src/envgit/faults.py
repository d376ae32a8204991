"""A test hook that kills this process at a named point, to prove that a kill -9 there loses
nothing. Off unless ENVGIT_FAULT is set (never in production):

    ENVGIT_FAULT=gc-delete-pack          SIGKILL at the first time that point is reached
    ENVGIT_FAULT=gc-delete-pack@3        … at the third time
    ENVGIT_FAULT=a,b@2                   either

The points are named where the code calls `point(...)`; tests/faults/ lists and kills each.
Standard library only: the journal calls it too.
"""

import os
import signal

_ARMED: dict[str, int] = {}
for _item in filter(None, os.environ.get("ENVGIT_FAULT", "").split(",")):
    _name, _, _nth = _item.partition("@")
    _ARMED[_name.strip()] = int(_nth) if _nth.isdigit() else 1
_SEEN: dict[str, int] = {}


def point(name: str) -> None:
    """A place where a kill must lose nothing; dies here if the test armed it."""
    if not _ARMED or name not in _ARMED:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)
