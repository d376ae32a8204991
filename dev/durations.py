"""Per test file: how many tests and how long they took, from pytest's JUnit XML files.

    python dev/durations.py BEFORE.xml [AFTER.xml ...]     # a Markdown table (docs/TESTING.md)

Each XML is one run (several for one run are given joined by commas: quick.xml,rest.xml). A
file renamed between the runs is matched through RENAMED, so its row shows both runs.
"""

import collections
import sys
import xml.etree.ElementTree as ET

# old file name -> new (tests moved or renamed between the runs compared)
RENAMED: dict[str, str] = {}


def per_file(paths: str):
    n, secs = collections.Counter(), collections.Counter()
    for path in paths.split(","):
        for case in ET.parse(path).getroot().iter("testcase"):
            f = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
            f = RENAMED.get(f, f)
            n[f] += 1
            secs[f] += float(case.get("time") or 0)
    return n, secs


def main(runs):
    tables = [per_file(r) for r in runs]
    files = sorted(set().union(*(t[0] for t in tables)), key=lambda f: -tables[0][1].get(f, 0))
    head = "| file | " + " | ".join(f"run {i + 1}: tests | s" for i in range(len(runs))) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(runs)))
    for f in files:
        cells = []
        for n, secs in tables:
            cells += [str(n.get(f, "")), f"{secs[f]:.0f}" if f in n else ""]
        print(f"| {f} | " + " | ".join(cells) + " |")
    tot = []
    for n, secs in tables:
        tot += [str(sum(n.values())), f"{sum(secs.values()):.0f}"]
    print("| **total** | " + " | ".join(tot) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
