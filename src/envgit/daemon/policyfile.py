"""The project's policy as the session daemon holds it: re-read whenever the file changes, so an
edit applies to the next step. Parsed and checked once per change (a bad file's error is kept
too, not re-parsed on every call), and by `load_off_loop` in a thread before a request uses it,
so a big or slow file never stalls the event loop (the other steps, the network gate)."""

import asyncio
import os

from ..policy import PolicyError, load_policy


class PolicyFile:
    def __init__(self, path):
        self.path = path
        self._policy = None
        self._key = None
        self._error = None
        self._reloading = False

    def current(self):
        """The policy now (PolicyError if the file is bad: the same error until it changes)."""
        key = self._stat()
        if key != self._key:
            try:
                self._policy, self._error = load_policy(self.path), None
            except PolicyError as e:
                self._policy, self._error = None, e
            self._key = key
        if self._error is not None:
            raise self._error
        return self._policy

    def _stat(self):
        from ..policy import userdefaults
        from ..policy.org import stat_key  # the organisation policy binds too (org.py)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        # and the person's own defaults, read under the project's file (userdefaults.py)
        return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns, stat_key(),
                userdefaults.stat_key())

    def for_gate(self):
        """The gate judges requests on the event loop: after an edit it keeps judging by the
        policy it has while the new one is parsed in a thread (a step begun after the edit
        waits for that parse in `dispatch`, so its requests are judged by the new policy)."""
        if self._policy is not None and self._stat() != self._key:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return self.current()           # not on the loop: parsing here stalls nothing
            if not self._reloading:
                self._reloading = True
                loop.create_task(self._reload())
            return self._policy
        return self.current()

    async def _reload(self):
        try:
            await self.load_off_loop()
        finally:
            self._reloading = False

    async def load_off_loop(self):
        if self._stat() != self._key:
            try:
                await asyncio.to_thread(self.current)
            except PolicyError:
                pass                    # said by the request that uses it
