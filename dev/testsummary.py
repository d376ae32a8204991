"""The closing lines of `dev/run test`: tests run, per tier, from the JUnit XML files pytest wrote.

    python dev/testsummary.py STAGE=SECONDS... -- FILE.xml...

Prints the slowest test files (summed test time: where the next speed work goes), the wall time
of each stage (lint, quick, the rest), and one plain closing line
`total: N passed, N failed, N skipped` over every file.
"""

import sys
import xml.etree.ElementTree as ET

SLOWEST = 15


def main(argv):
    sep = argv.index("--")
    stages, files = argv[:sep], argv[sep + 1:]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    per_file: dict[str, float] = {}
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"dev/run: {path}: no test report ({e})", file=sys.stderr)
            counts["failed"] += 1
            continue
        for case in root.iter("testcase"):
            where = case.get("classname") or "?"      # the module, or module.Class
            per_file[where] = per_file.get(where, 0.0) + float(case.get("time") or 0)
            kinds = {child.tag for child in case}
            if "failure" in kinds or "error" in kinds:
                counts["failed"] += 1
            elif "skipped" in kinds:
                msg = next(c for c in case if c.tag == "skipped").get("type", "")
                counts["xfailed" if "xfail" in msg else "skipped"] += 1
            else:
                counts["passed"] += 1
    slowest = sorted(per_file.items(), key=lambda kv: -kv[1])[:SLOWEST]
    if slowest:
        print(f"---- the {len(slowest)} slowest test files (summed test time) ----")
        for where, secs in slowest:
            print(f"{secs:8.1f} s  {where}")
    print("---- dev/run test: wall time per stage ----")
    for st in stages:
        name, _, secs = st.partition("=")
        s = int(secs)
        print(f"{name:22} {s // 60:3d} min {s % 60:02d} s")
    if counts["xfailed"]:
        print(f"expected failures (open holes, marked xfail with why): {counts['xfailed']}")
    # the plain closing line CI reads: nothing after the skipped count
    print(f"total: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
