"""Rewound branches: the steps a rewind stepped over, derived from the main journal (never
stored), and their removal markers (docs/FORMAT.md, "Branches").

A rewind step R whose `rewind` says it went back to `to_step` from `undo_step` (the step whose
snapshot is the directory as the rewind found it) stepped over steps `to_step+1 .. undo_step`:
that range is branch `r<R>`, its tree the rewind's `undo_tree`. gc (daemon/gcop.py) keeps the
snapshots of those steps whatever its retention rule says, until `envgit branch rm r<R>` writes
`.envgit/branches/r<R>.removed`. An adopt (its `rewind` carries `adopt`) brings a tree in
rather than going back, and a rewind with no `to_step` names no range: neither is a branch.

Standard library only, like registry.py: the daemon's gc reads it."""

import json
import os
import time

from ..atomicfile import write_atomic
from .registry import branches_dir

REMOVED_SUFFIX = ".removed"


def rewound(steps) -> list[dict]:
    """Every rewound branch of the journal's steps (journal.steps(): folded, by id), oldest
    first: {"kind": "rewound", "id": "r<R>", "rewind_step": R, "steps": [first, last],
    "tree": undo_tree, "to_step", "started_ns"}."""
    out = []
    for s in steps:
        info = s.rewind
        if not info or not info.get("undo_tree") or info.get("adopt") is not None:
            continue
        to, last = info.get("to_step"), info.get("undo_step")
        if type(to) is not int or type(last) is not int or to + 1 > last:
            continue
        out.append({"kind": "rewound", "id": f"r{s.id}", "rewind_step": s.id, "steps": [to + 1, last],
                    "tree": info["undo_tree"], "to_step": to, "started_ns": s.started_ns})
    return out


def parse_id(text: str) -> int | None:
    """R for a rewound branch's id `r<R>`, else None."""
    return int(text[1:]) if text[:1] == "r" and text[1:].isdigit() and int(text[1:]) > 0 else None


def marker_path(project, rewind_step: int) -> str:
    return os.path.join(branches_dir(project), f"r{int(rewind_step)}{REMOVED_SUFFIX}")


def remove(project, rewind_step: int) -> bool:
    """Mark branch r<R> removed (`envgit branch rm r<R>`): gc may then drop its steps'
    snapshots by its retention rule. True when it was not removed before."""
    path = marker_path(project, rewind_step)
    if os.path.exists(path):
        return False
    os.makedirs(branches_dir(project), mode=0o700, exist_ok=True)
    body = {"version": 1, "id": f"r{int(rewind_step)}", "rewind_step": int(rewind_step),
            "removed_ns": time.time_ns()}
    write_atomic(path, json.dumps(body) + "\n", 0o600, chmod=0o600)
    return True


def removed(project) -> set[int]:
    """The rewind steps R whose branch r<R> was removed."""
    try:
        names = os.listdir(branches_dir(project))
    except FileNotFoundError:
        return set()
    out = set()
    for name in names:
        if name.endswith(REMOVED_SUFFIX):
            r = parse_id(name[:-len(REMOVED_SUFFIX)])
            if r is not None:
                out.add(r)
    return out


def kept_steps(steps, project) -> set[int]:
    """The steps whose snapshots branches keep from gc: every step of a rewound branch not
    removed, and every fork branch's fork point (registry.py)."""
    from . import registry
    gone = removed(project)
    out: set[int] = set()
    for b in rewound(steps):
        if b["rewind_step"] not in gone:
            out.update(range(b["steps"][0], b["steps"][1] + 1))
    for f in registry.forks(project):
        if type(f.get("from_step")) is int:
            out.add(f["from_step"])
    return out
