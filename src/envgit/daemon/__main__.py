import sys

from ..importpath import project_entries, refusal

# A second wall behind client._spawn's `-P` from "/": never serve a project whose files are on
# this process's import path (a step could rewrite the daemon's own code).
if len(sys.argv) == 2 and (_inside := project_entries(sys.argv[1])):
    print(f"envgit: {refusal(sys.argv[1], _inside)}", file=sys.stderr)
    sys.exit(2)

# Its name in top, pidof and process accounting (otherwise "python", like any interpreter);
# `ps` shows the whole command line, project included, as before.
try:
    with open("/proc/self/comm", "w") as _comm:
        _comm.write("envgit-daemon")
except OSError:
    pass

from .server import main  # noqa: E402

sys.exit(main())
