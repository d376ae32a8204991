"""Packaging: what a plain `pip install envgit` gives, and what each extra adds.

- Every third-party package src/envgit imports is declared in pyproject.toml, in the core
  dependencies or in the extra of the part that imports it; the core holds none of an extra's.
- A command whose extra is not installed says so in one `envgit:` line naming
  `pip install 'envgit[EXTRA]'`, exit 125, no traceback.
- With every extra missing, steps, the gate and rewind still work (the plain install).

"Not installed" is made by a directory put first on PYTHONPATH holding, for each package of
the extra, a stub whose import raises ModuleNotFoundError as an uninstalled package's does: it
stands in for the package not being installed (the venv the tests run in has every extra).
The session daemon inherits PYTHONPATH (importpath.py), so it sees the same.
"""

import ast
import functools
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "envgit"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dist_names(reqs) -> set[str]:
    return {re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


CORE = _dist_names(PYPROJECT["dependencies"])
EXTRAS = {k: _dist_names(v) for k, v in PYPROJECT.get("optional-dependencies", {}).items()}


def _third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} for every absolute import in src/envgit that is
    neither the standard library nor envgit's own (the VM guest agent's and the shims' sibling
    files, which run with their own directory on sys.path, count as envgit's)."""
    files = list(SRC.rglob("*.py"))

    def own(top, path):         # one of envgit's files, copied beside the script that imports it
        return any(p.stem == top and p != path for p in files)
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "envgit" and not own(top, path):
                    found.setdefault(top, set()).add(str(path.relative_to(SRC)))
    return found


@functools.cache
def _distributions() -> dict:
    return packages_distributions()


def _dists(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in _distributions().get(module, [])}


def test_every_imported_package_is_declared_where_it_is_used():
    imports = _third_party_imports()
    assert {"mitmproxy", "yaml", "boto3", "starlette", "mcp"} <= set(imports)   # the scan sees imports
    declared = CORE.union(*EXTRAS.values())
    for module, files in sorted(imports.items()):
        dists = _dists(module)
        assert dists, f"{module} (imported by {sorted(files)}) is not installed in the test venv"
        assert dists & declared, f"{module} (imported by {sorted(files)}) is not declared in pyproject.toml"
        # an import inside an optional part is declared by that part's extra (or the core)
        for part in ("ui", "mcp", "remote"):
            if any(f.startswith(part + "/") for f in files) and not dists & CORE:
                assert dists & EXTRAS.get(part, set()), f"{module}: imported by {part}/, not in envgit[{part}]"


def test_the_core_holds_no_extra_and_each_extra_provides_what_envgit_checks():
    from envgit.extras import EXTRAS as NEEDED
    assert {"ui", "mcp", "remote", "aws", "all"} <= set(EXTRAS)
    assert EXTRAS["all"] == EXTRAS["ui"] | EXTRAS["mcp"] | EXTRAS["remote"] | EXTRAS["aws"]
    spelled = {extra: sorted(PYPROJECT["optional-dependencies"][extra]) for extra in ("ui", "mcp", "remote", "aws")}
    assert set(PYPROJECT["optional-dependencies"]["all"]) == {r for reqs in spelled.values() for r in reqs}
    for extra, modules in NEEDED.items():
        for module in modules:
            assert _dists(module) & EXTRAS[extra], f"{module}: envgit.extras says envgit[{extra}], pyproject does not"
        assert not (EXTRAS[extra] & CORE) - {"cryptography"}, f"envgit[{extra}] packages in the core"
    assert {"mcp", "starlette", "uvicorn", "sse-starlette", "boto3", "botocore"}.isdisjoint(CORE)
    # the exact versions the tests ran with: every declared package pinned in constraints.txt
    pins = {re.sub(r"[-_.]+", "-", ln.split("==")[0]).lower()
            for ln in (ROOT / "constraints.txt").read_text().splitlines() if "==" in ln}
    for dist in CORE.union(*EXTRAS.values()) - {"envgit"}:
        assert re.sub(r"[-_.]+", "-", dist) in pins, f"{dist} is declared but not pinned in constraints.txt"
    assert {"mitmproxy", "cryptography", "pyyaml", "blake3", "zstandard"} <= CORE   # the gate and the store


def _core_closure() -> set[str]:
    """The distributions a plain install brings: the core dependencies and theirs."""
    from importlib.metadata import PackageNotFoundError, requires
    seen, todo = set(), list(CORE)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += _dist_names(r for r in reqs if "extra ==" not in r and "sys_platform == \"win32\"" not in r)
    return seen


def _uninstalled(tmp_path, modules) -> dict:
    """A PYTHONPATH on which each of `modules` imports as if it were not installed."""
    stubs = tmp_path / "uninstalled"
    for m in modules:
        (stubs / m).mkdir(parents=True, exist_ok=True)
        (stubs / m / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{m}'\", name={m!r})\n")
    return {"PYTHONPATH": str(stubs)}


@pytest.mark.parametrize("extra,argv", [
    ("remote", ["remote", "add", "ci", "s3://bucket/envgit", "--endpoint", "http://127.0.0.1:9"]),
    ("remote", ["log", "--remote", "ci"]),
    ("remote", ["fsck", "--remote", "ci"]),
    ("ui", ["ui", "--no-open"]),
    ("mcp", ["mcp"]),
])
def test_a_command_without_its_extra_says_which_to_install(bare_proj, tmp_path, extra, argv):
    from envgit.extras import EXTRAS as NEEDED
    r = bare_proj.envgit(*argv, env=_uninstalled(tmp_path, NEEDED[extra]), input="", timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envgit: "), r.stderr
    assert f"pip install 'envgit[{extra}]'" in lines[0], r.stderr


def test_json_errors_stay_json_without_the_extra(bare_proj, tmp_path):
    from envgit.extras import EXTRAS as NEEDED
    r = bare_proj.envgit("remote", "add", "ci", "s3://bucket/envgit", "--json",
                         env=_uninstalled(tmp_path, NEEDED["remote"]))
    assert r.returncode == 125 and r.stderr == "", (r.returncode, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["exit"] == 125 and "pip install 'envgit[remote]'" in doc["error"]


def test_the_plain_install_runs_steps_the_gate_and_rewind(bare_proj, tmp_path):
    """No extra at all: a step, a request judged by the gate, a rewind."""
    from envgit.extras import EXTRAS as NEEDED
    core = _core_closure()
    missing = sorted(m for m in set().union(*NEEDED.values()) if not _dists(m) & core)
    assert {"boto3", "mcp", "starlette", "uvicorn"} <= set(missing)
    env = _uninstalled(tmp_path, missing)
    bare_proj.write_policy("version: 1\nnetwork:\n  allow: [\"example.invalid\"]\n")
    r = bare_proj.envgit("run", "--", "sh", "-c", "echo one > f", env=env)
    assert r.returncode == 0, r.stderr
    r = bare_proj.envgit("run", "--", "sh", "-c", "echo two > f; curl -sS https://not-allowed.example/", env=env)
    assert "CONNECT tunnel failed, response 403" in r.stderr, r.stderr    # the gate answered, and denied
    shown = json.loads(bare_proj.envgit("show", "last", "--json", env=env).stdout)
    assert [(q["host"], q["decision"]) for q in shown["requests"]] == [("not-allowed.example", "deny")]
    assert (bare_proj.root / "f").read_text() == "two\n"
    r = bare_proj.envgit("rewind", "1", "--yes", env=env)
    assert r.returncode == 0, r.stderr
    assert (bare_proj.root / "f").read_text() == "one\n"
