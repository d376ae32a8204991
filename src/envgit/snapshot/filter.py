"""What a snapshot leaves out: `.envgit` at the root, excluded globs, files over a size limit.

Capture and restore share one Filter, so a rewind never deletes or overwrites what capture left
out. Globs use the policy's syntax (gitignore-like, see envgit.policy.globs).
"""

import os
import re

from envgit.policy.globs import compile_glob

STATE_DIR = b".envgit"
DEFAULT_MAX_FILE_SIZE = 256 << 20


class Filter:
    def __init__(self, exclude: list[str] | tuple[str, ...] = (), max_file_size: int | None = DEFAULT_MAX_FILE_SIZE):
        self.exclude = list(exclude)
        self.max_file_size = max_file_size
        # One alternation: a single C-level regex match per path instead of one per pattern.
        self._excluded = (re.compile("|".join(f"(?:{compile_glob(p).pattern})" for p in self.exclude),
                                     re.DOTALL).match if self.exclude else None)

    def excluded(self, relpath: bytes) -> bool:
        """Is this path (relative, "/"-separated bytes) left out whatever its size?"""
        if relpath == STATE_DIR:
            return True
        return self._excluded is not None and self._excluded(os.fsdecode(relpath)) is not None

    def too_large(self, size: int) -> bool:
        return self.max_file_size is not None and size > self.max_file_size

    def key(self) -> tuple:
        """Two filters with equal keys leave out the same paths (the stat cache checks this)."""
        return (tuple(self.exclude), self.max_file_size)
