"""Makes format-v1/: a small snapshot store and journal written by envgit format version 1,
checked in so that tests/faults/test_format_vectors.py proves this code still reads them.
Run once (it refuses to overwrite); never regenerate to make a test pass."""

import os
import sys
from pathlib import Path

from envgit.journal import Journal
from envgit.snapshot import Filter, Store

HERE = Path(__file__).parent / "format-v1"


def make_tree(root: Path) -> None:
    """The fixed directory the checked-in snapshot holds (tests rebuild it to compare)."""
    root.mkdir()
    (root / "a.txt").write_bytes(b"hello\n")
    (root / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "link").symlink_to("a.txt")
    (root / "sub").mkdir()
    (root / "sub" / "b.bin").write_bytes(b"".join(b"line %d of a chunked file\\n" % i for i in range(60000)))
    (root / "empty").mkdir()
    for p, mode in (("a.txt", 0o644), ("run.sh", 0o755), ("sub/b.bin", 0o600), ("sub", 0o755),
                    ("empty", 0o700), ("", 0o755)):
        os.chmod(root / p, mode)


def main():
    if HERE.exists():
        sys.exit(f"{HERE} exists: the checked-in data is never regenerated")
    work = Path(sys.argv[1]) / "work"
    make_tree(work)
    HERE.mkdir()
    store = Store(HERE / "objects")
    snap = store.snapshot(work, Filter())
    store.close()
    j = Journal(str(HERE / "journal.sqlite"))
    step = j.begin_step({"argv": ["sh", "-c", "make"], "cwd": "/project", "session": "s1", "user": "u",
                         "pid": 1, "policy_sha256": "0" * 64, "tool_call_id": None, "marks": []})
    j.append(step, "end", {"exit_code": 0, "signal": None, "duration_ms": 1.5, "marks": [],
                           "denied_paths": [], "snapshot": {"tree": snap.tree_id, "added": 4, "modified": 0,
                                                            "deleted": 0, "bytes": 0, "paths": [], "ms": 1.0}})
    j.append(0, "gc", {"dropped": [], "kept": [1]})
    j.close()
    print(snap.tree_id)


if __name__ == "__main__":
    main()
