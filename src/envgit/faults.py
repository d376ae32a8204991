"""A test hook that kills this process at a named point, to prove that a kill -9 there loses
nothing. Off unless ENVGIT_FAULT is set (never in production):

    ENVGIT_FAULT=gc-delete-pack          SIGKILL at the first time that point is reached
    ENVGIT_FAULT=gc-delete-pack@3        … at the third time
    ENVGIT_FAULT=a,b@2                   either
    ENVGIT_FAULT=adopt-copied:pause      stop there (not killed) while the file
                                         $ENVGIT_FAULT_DIR/adopt-copied.paused exists: written
                                         on arrival, the test removes it to go on (60 s at most)

The points are named where the code calls `point(...)`; tests/faults/ lists and kills each.
Standard library only: the journal calls it too.
"""

import os
import signal
import time

_ARMED: dict[str, int] = {}
_PAUSE: set[str] = set()
for _item in filter(None, os.environ.get("ENVGIT_FAULT", "").split(",")):
    _item, _, _how = _item.partition(":")
    _name, _, _nth = _item.partition("@")
    _ARMED[_name.strip()] = int(_nth) if _nth.isdigit() else 1
    if _how.strip() == "pause":
        _PAUSE.add(_name.strip())
_SEEN: dict[str, int] = {}


def point(name: str) -> None:
    """A place where a kill must lose nothing; dies here if the test armed it."""
    if not _ARMED or name not in _ARMED:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] != _ARMED[name]:
        return
    if name not in _PAUSE:
        os.kill(os.getpid(), signal.SIGKILL)
    # a pause: what else may run meanwhile (another op of the daemon) is what the test checks
    flag = os.path.join(os.environ.get("ENVGIT_FAULT_DIR", "/tmp"), name + ".paused")
    with open(flag, "w"):
        pass
    deadline = time.monotonic() + 60
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
