"""The optional parts of envgit and the pip extra that installs each (pyproject.toml).

A plain `pip install envgit` runs steps, the gate, snapshots and rewinds. `envgit ui`, `envgit
mcp`, remotes and AWS-profile credentials need packages of their own; a command that needs one
that is missing says so in one line naming the `pip install 'envgit[…]'` that fixes it (exit
125: envgit itself cannot do it here), never with a traceback. Every place that imports an
optional package calls `need(extra)` first. Standard library only, and imported only where an
optional part is about to be used (never on the hot path).
"""

import importlib

# What each extra's part imports directly (the import names, not the distribution names).
# Keep in step with [project.optional-dependencies] in pyproject.toml.
EXTRAS = {
    "ui": ("starlette", "uvicorn", "sse_starlette", "jinja2", "markupsafe"),
    "mcp": ("mcp", "mcp_types", "anyio", "pydantic"),
    "remote": ("boto3", "botocore", "urllib3"),
    "aws": ("botocore",),
}
WHAT = {
    "ui": "envgit ui",
    "mcp": "envgit mcp",
    "remote": "remotes (remote, push, audit, log --remote, restore --from, fsck --remote)",
    "aws": "a credential from an AWS profile (SigV4 re-signing)",
}
EXIT = 125                      # envgit itself cannot do it on this machine (as `envgit run`'s 125)


class MissingExtra(Exception):
    def __init__(self, extra: str, module: str):
        super().__init__(f"{WHAT[extra]} needs {module}, which is not installed; "
                         f"install it with: pip install 'envgit[{extra}]'")
        self.extra, self.module = extra, module


def need(extra: str) -> None:
    """Import every package the extra provides; MissingExtra names the first that does not
    import. (The import is what the caller was about to do anyway: it costs nothing more.)"""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(extra, module) from None


def say(e: MissingExtra, json: bool = False) -> int:
    """Print the one line (or with --json the error document) and return the exit code."""
    import sys
    if json:
        import json as _json
        print(_json.dumps({"error": str(e), "exit": EXIT}, indent=2))
    else:
        print(f"envgit: {e}", file=sys.stderr)
    return EXIT
