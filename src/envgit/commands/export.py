"""`envgit export`: the journal's steps for others to read: JSON lines, or one static HTML file."""

import json
import os
import sys

from ..paths import find_project
from . import Usage, command, open_journal


def add_parsers(sub, argparse):
    from .args import since
    s = command(sub, "export", help="every step as one self-contained JSON record a line, or a static HTML report",
                example=["envgit export > steps.jsonl", "envgit export --since 1d --format jsonl",
                         "envgit export --html report.html --session claude:3fa2"])
    s.add_argument("--since", metavar="WHEN", type=since, default=None,
                   help="steps started since then: a duration back (30m, 2h, 1d) or an ISO-8601 time")
    s.add_argument("--session", metavar="S", help="one session's steps (its id, or AGENT:TAG as `envgit log` shows it)")
    s.add_argument("--format", choices=sorted(FORMATS), default="jsonl", help="the records' format (default jsonl)")
    s.add_argument("--html", metavar="FILE",
                   help="write one static HTML report (no script, no network) to FILE instead")
    s.set_defaults(fn=cmd_export)


def write_jsonl(records, stream):
    """One record a line, ASCII-only JSON (controls and bidi characters escaped)."""
    for r in records:
        stream.write(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n")


def write_ocsf(records, stream):
    """OCSF events for a SIEM: export/ocsf.py."""
    from ..export.ocsf import write_ocsf as write
    write(records, stream)


# --format NAME -> the function writing the records (export/records.py) to a text stream:
# one more format is one more entry here.
FORMATS = {"jsonl": write_jsonl, "ocsf": write_ocsf}


def cmd_export(args):
    from ..export.records import records
    from .timeline import _pick_session
    project = find_project()
    j = open_journal(project)
    session = _pick_session(j, args.session) if args.session is not None else None
    recs = records(j, args.since, session) if j is not None else iter(())
    if args.html is None:
        FORMATS[args.format](recs, sys.stdout)
        return 0
    from ..export.html import render
    title = f"envgit report: {os.path.basename(project.root)}" + (f", session {session}" if session else "")
    text = render(recs, title)
    # Whole or absent, and never through a symlink a step planted in the project at the
    # target or at a temporary's name (atomicfile.py).
    from ..atomicfile import write_atomic
    try:
        write_atomic(os.path.abspath(args.html), text)
    except OSError as e:
        raise Usage(f"cannot write {args.html}: {e.strerror or e}; give a writable path") from None
    print(f"wrote {args.html}", file=sys.stderr)
    return 0
