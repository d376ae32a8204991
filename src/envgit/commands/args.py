"""Arguments several commands read alike: `--since WHEN` (log, audit, export, stats)."""

import time


def since(text) -> int:
    """`--since`: nanoseconds since the epoch, from a duration back or an ISO-8601 time."""
    import argparse
    from datetime import UTC, datetime
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if text[-1:] in units and text[:-1].isdigit():
        return time.time_ns() - int(text[:-1]) * units[text[-1]] * 1_000_000_000
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration back (30m, 2h, 7d) or an "
                                         "ISO-8601 time (2026-12-01T09:30:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1_000_000_000)
