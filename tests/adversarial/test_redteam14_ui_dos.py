"""Red team, round 14: a step wedges `envgit ui`'s step page with a diff that is cheap to
write and very expensive to show.

The page (ui/stepview.py) diffs every changed text file up to 1 MiB a side with difflib
before its 2 MiB text budget is looked at. difflib's matcher is quadratic when lines repeat
often but stay under its "popular line" cut-off (1% of the lines): a step writes a file of
~250k short lines drawn from ~2,500 values, and the next step writes another such file.
One view of the second step's page then spends minutes of CPU in the server (a thread per
view: a few reloads take both cores and every worker), and the person never sees what the
step changed. `envgit diff` shares the code (commands/diff.py unified_lines).

Oracle: the server's answer to GET /steps/N within a bound a person would wait."""

import time

from harness import attacker  # noqa: F401  (the fixture)
from uikit import UI

WRITE = ("python3 -c 'import random, sys\n"
         "random.seed(int(sys.argv[1]))\n"
         "open(\"big.txt\", \"w\").write(\"\".join(\"%d\\n\" % random.randrange(2500) for _ in range(230000)))\n' ")


def test_step_page_answers_despite_a_quadratic_diff(attacker):
    a = attacker
    a.run(WRITE + "1 && wc -c big.txt", check=True, timeout=120)
    r = a.run(WRITE + "2 && wc -c big.txt", check=True, timeout=120)
    size = int(r.stdout.split()[0])
    assert size < 1 << 20                     # under the 1 MiB the page still diffs
    with UI(a) as ui:
        assert ui.get("/steps/1")[0] == 200   # the page works
        t0 = time.monotonic()
        try:
            status, _, body = ui.get("/steps/2", timeout=45)
        except TimeoutError:
            status, body = None, ""
        took = time.monotonic() - t0
        assert status == 200 and "big.txt" in body, (
            f"the step page did not answer in {took:.0f} s: a step's 2 files of {size} bytes "
            "wedge the page (difflib on repeated lines)")
