"""One git_changes call's budget of time and bytes (snapshot/gitview.py), shared by both sides
and every repository: a step chooses the bytes under `.git`, so reading them must end in seconds
whatever it left. What is left unread once the budget is spent is said as BUDGET_PROBLEM.
"""

import time

BUDGET_SECONDS = 4.0        # one git_changes call, everything in it (diff and the rewind plan wait on it)
BUDGET_BYTES = 512 << 20    # of files read in one call (indexes, pack indexes, refs, objects' files)


class BudgetSpent(Exception):
    """The call's time or bytes are spent: what is left is said as BUDGET_PROBLEM."""


BUDGET_PROBLEM = (f"budget (envgit's git view spends at most {BUDGET_SECONDS:g} s and "
                  f"{BUDGET_BYTES >> 20} MiB a call; the files are listed by --raw)")


def new_budget() -> "Budget":
    return Budget(BUDGET_SECONDS, BUDGET_BYTES)


class Budget:
    """One call's time and bytes, shared by both sides and every repository."""

    def __init__(self, seconds: float, nbytes: int):
        self.deadline = time.monotonic() + seconds
        self.left = nbytes

    def over(self) -> bool:
        return self.left <= 0 or time.monotonic() > self.deadline

    def check(self) -> None:
        if self.over():
            raise BudgetSpent()

    def take(self, n: int) -> None:
        """Before reading `n` bytes of a stored file."""
        self.check()
        if n > self.left:
            self.left = 0
            raise BudgetSpent()
        self.left -= n
