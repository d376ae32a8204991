"""`python -m envgit.agents AGENT [ARGS…]`: the same as `envgit AGENT [ARGS…]`."""
import sys

from . import main

if len(sys.argv) < 2:
    print("usage: python -m envgit.agents claude|codex|copilot [ARGS…]", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[1], sys.argv[2:]))
