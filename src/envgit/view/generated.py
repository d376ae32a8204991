"""Which changed paths lie in a generated directory, shown folded to one line with its count and
size: an install step writes thousands of files under `.venv` or `node_modules` that nobody reads
as a diff, and listing each buries the two files that matter (the page of `pip install pytest`
was 2.8 MB of site-packages before its requests).

Generated: a directory named in GENERATED (virtualenvs, package and build outputs, caches), or
one the project's top `.gitignore` ignores (as git reads it: a pattern without a slash names a
directory at any depth, one with a slash is anchored at the top, `!` takes one back, the last
match wins). Only directories fold: a single ignored file is still shown. Pure: the caller hands
the `.gitignore`'s bytes in.
"""

import re

GENERATED = frozenset({
    ".venv", "venv", "node_modules", "__pycache__", "site-packages", "dist", "build", "target",
    ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".eggs", ".gradle", ".next",
    ".parcel-cache", ".turbo", ".cache",
})


class Ignore:
    """The directory patterns of one `.gitignore` at the project's top."""

    def __init__(self, text: bytes | None):
        self.rules: list[tuple[bool, bool, re.Pattern]] = []     # (negated, anchored, regex)
        for raw in (text or b"").decode("utf-8", "replace").splitlines():
            line = raw.rstrip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            line = line[1:] if neg else line
            if line.startswith("\\"):
                line = line[1:]
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            if line:
                self.rules.append((neg, anchored, re.compile(_translate(line) + r"\Z")))

    def ignores(self, directory: str) -> bool:
        """Whether git would ignore the directory `directory` (project-relative, no slash at
        either end) by these patterns alone (its parents are the caller's: `fold_key`)."""
        out = False
        base = directory.rsplit("/", 1)[-1]
        for neg, anchored, rx in self.rules:
            if rx.match(directory if anchored else base):
                out = not neg
        return out


def _translate(glob: str) -> str:
    """A gitignore glob as a regex over a slash-separated path."""
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("/.*")
            i += 3
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in glob[i + 2:]:
            j = glob.index("]", i + 2)
            body = glob[i + 1:j]
            out.append("[" + ("^" + body[1:] if body[:1] == "!" else body).replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def fold_key(path: str, ignore: Ignore | None = None) -> str | None:
    """The topmost generated directory `path` lies in (its project-relative path), or None."""
    parts = path.split("/")
    for n in range(1, len(parts)):
        d = "/".join(parts[:n])
        if parts[n - 1] in GENERATED or parts[n - 1].endswith(".egg-info") or (ignore and ignore.ignores(d)):
            return d
    return None


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")
