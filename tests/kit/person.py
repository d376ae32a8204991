"""The person at another terminal: answers the first question a step's request raises with
`envgit approve ID` or `envgit deny ID`, as soon as `envgit pending` lists it."""

import json
import threading
import time


def answer_when_asked(env, answer: str, deadline_s: float = 100) -> threading.Thread:
    """Started at once; join it after the step. `answer`: "approve" or "deny". It looks for
    `deadline_s` (below the default ask_timeout, 120 s): the step's start, a new daemon and its
    gate included, takes seconds on a loaded machine before anything is asked."""
    def run():
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            asks = json.loads(env.envgit("pending", "--json").stdout or "[]")
            if asks:
                env.envgit(answer, str(asks[0]["id"]))
                return
            time.sleep(0.1)
    t = threading.Thread(target=run)
    t.start()
    return t
