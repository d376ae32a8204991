"""The daemon re-verifies packs while no step runs (issue 32, case 2).

Damage nobody has read yet (a flipped bit in a blob whose file's stat never changes) used to be
reused by id at every step until some reader hit it. The daemon now re-hashes its packs in its
idle loop: a pack's BLAKE3 is its name, so re-hashing it detects any flip, and its index is
decoded again (its checksum detects a flip there). Packs sealed during this daemon's life come
first, then the older ones; each is verified once per pass, and a new pass starts at most every
RESCRUB_S. Damage found is handled as a reader's find: each copy that does not read back is
quarantined (the `damaged` list, damaged_list.py), and every object of a pack whose index no
longer reads is listed too (other processes cannot see them: missing.py), so the next snapshot
stores what the working tree still holds again.

Cost: the work runs in slices of at most SLICE_S between the idle loop's ticks (1 s), reading
CHUNK bytes at a time and stopping as soon as a step or request begins; and, so that steps run
back to back with no idle second between them still get their packs verified, in a slice of at
most STEP_BUDGET bytes on a thread of its own after each snapshot, stopping when the next
snapshot (or a restore, a gc) takes the snapshotter's lock. Hashing runs outside that lock (BLAKE3
releases the GIL: ~2.9 GB/s on one core, so a step's slice is ~6 ms of one core); the lock is
only taken to pick the next pack and to quarantine.
"""

import os
import threading
import time

from blake3 import blake3

from . import packs
from .ids import CorruptObject
from .objects import StoreError

SLICE_S = 0.25
CHUNK = 1 << 20
STEP_BUDGET = 16 << 20
# "0" turns it off: the tests of what a reader's find does set it, so the daemon does not find
# the damage first.
ENABLED = os.environ.get("ENVGIT_DAEMON_SCRUB", "1") != "0"
RESCRUB_S = 3600.0


class Scrubber:
    def __init__(self, objects):
        self.objects = objects
        self.older = set(objects.pack_entries)     # sealed before this daemon started
        self.verified: set[str] = set()
        self.current: list | None = None            # [pack id, hasher, bytes hashed]
        self.pass_started = time.monotonic()
        self.found = 0                              # damaged copies found (for tests, logs)
        self.running = threading.Lock()             # the idle loop's slice or a step's, not both

    def run(self, lock, busy, slice_s: float = SLICE_S, budget: int | None = None) -> None:
        """Hash for at most `slice_s` (and `budget` bytes), stopping when `busy()`; resumes
        where it stopped."""
        if not ENABLED or not self.running.acquire(blocking=False):
            return
        try:
            self._run(lock, busy, slice_s, budget)
        finally:
            self.running.release()

    def _run(self, lock, busy, slice_s, budget) -> None:
        deadline = time.monotonic() + slice_s
        while time.monotonic() < deadline and not busy() and (budget is None or budget > 0):
            if self.current is None:
                if not lock.acquire(blocking=False):
                    return
                try:
                    pack_id = self._next()
                finally:
                    lock.release()
                if pack_id is None:
                    return
                self.current = [pack_id, blake3(), 0]
            pack_id, hasher, done = self.current
            try:
                with open(packs.pack_path(self.objects.packs_dir, pack_id, ".pack"), "rb") as f:
                    f.seek(done)
                    chunk = f.read(CHUNK)
            except OSError:                  # gc removed it meanwhile
                self.current = None
                self.verified.add(pack_id)
                continue
            if chunk:
                hasher.update(chunk)
                self.current[2] += len(chunk)
                if budget is not None:
                    budget -= len(chunk)
                continue
            self.current = None
            self.verified.add(pack_id)
            index_sound = self._index_sound(pack_id)
            if hasher.hexdigest() != pack_id or not index_sound:
                with lock:
                    self._quarantine(pack_id, index_sound)

    def _next(self) -> str | None:
        held = self.objects.pack_entries
        todo = [p for p in held if p not in self.verified]
        if not todo:
            if time.monotonic() - self.pass_started < RESCRUB_S:
                return None
            self.verified.clear()
            self.pass_started = time.monotonic()
            todo = list(held)
        todo.sort(key=lambda p: p in self.older)      # this session's packs first
        return todo[0] if todo else None

    def _index_sound(self, pack_id: str) -> bool:
        try:
            with open(packs.pack_path(self.objects.packs_dir, pack_id, ".idx"), "rb") as f:
                found, _ = packs.decode_index(f.read())
            return found == pack_id
        except FileNotFoundError:
            return True                      # gc removed the pack meanwhile
        except (OSError, ValueError):
            return False

    def _quarantine(self, pack_id: str, index_sound: bool) -> None:
        objects = self.objects
        entries = objects.pack_entries.get(pack_id)
        if entries is None:
            return
        bad = set()
        for oid, kind, flags, _, offset, raw_len, stored_len in entries:
            if not index_sound:
                bad.add((oid, pack_id))      # no other process can find it
                continue
            try:
                objects._read(oid, (pack_id, offset, kind, flags, raw_len, stored_len))
            except (CorruptObject, StoreError):
                bad.add((oid, pack_id))
        self.found += len(bad)
        objects.quarantine_copies(bad)
