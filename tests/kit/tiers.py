"""Which tier a test belongs to, read from what the test uses (never written by hand).

A test is `quick` when nothing it runs on the test side starts a process or a server: its own
code, the fixtures it asks for and every test-side function or class those reach (followed
through their globals), looked at as compiled code, names only. Anything else is marked by what
it needs: `sandbox` (a process: the CLI, bwrap, git, a server), and beside it `vm`, `browser`,
`agents` or `s3` when it reaches what those need. A test may say more than the analysis finds
(`@pytest.mark.sandbox`); the quick tier is also checked while it runs (see `Guard`): a quick
test that starts a process fails, naming the marker to add.
"""

import inspect
import os
import sys
import types

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A name in a test's code (a global, an attribute, a method) that starts a process or a server.
PROCESS_NAMES = frozenset({
    "subprocess", "Popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv",
    "execve", "execvp", "execvpe", "spawnv", "pty", "ENVGIT", "envgit", "HTTPServer",
    "ThreadingHTTPServer", "TCPServer", "serve_forever", "create_server", "start_server",
})
# A name that says which heavier thing a test needs (beside `sandbox`).
NEEDS = {
    "vm": frozenset({"VM_CACHE", "SHARED_CACHE", "shared_image", "vm"}),
    "browser": frozenset({"browser", "have_browser", "webdriver", "CHROMIUM"}),
    "agents": frozenset({"agent_bin", "AgentTerminal", "claude_bin", "codex_bin", "copilot_bin",
                         "agent_command"}),
    "s3": frozenset({"S3Server", "s3"}),
}
TIERS = ("quick", "sandbox", *NEEDS)


def _is_test_side(obj) -> bool:
    code = getattr(obj, "__code__", None)
    path = code.co_filename if code else getattr(sys.modules.get(getattr(obj, "__module__", "")),
                                                  "__file__", None)
    return bool(path) and os.path.abspath(path).startswith(TESTS + os.sep)


def _names(code: types.CodeType):
    yield from code.co_names
    yield from code.co_varnames        # a fixture's parameters: `def world(s3, ...)`
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def names_reached(objs) -> set[str]:
    """Every name the test-side code of `objs` reaches, followed through globals into other
    test-side functions and classes (bounded by the set of those already seen)."""
    seen, names, todo = set(), set(), list(objs)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not _is_test_side(obj):
            continue
        seen.add(id(obj))
        if inspect.isclass(obj):
            names.add(obj.__name__)
            todo.extend(v for v in vars(obj).values() if inspect.isfunction(v) or isinstance(v, property))
            continue
        if isinstance(obj, property):
            todo.extend(f for f in (obj.fget, obj.fset) if f)
            continue
        func = inspect.unwrap(obj)
        code = getattr(func, "__code__", None)
        if code is None:
            continue
        g = getattr(func, "__globals__", {})
        for n in _names(code):
            names.add(n)
            v = g.get(n)
            if v is not None and (inspect.isfunction(v) or inspect.isclass(v)):
                todo.append(v)
    return names


def tiers_of(item) -> set[str]:
    """The tiers of a collected pytest item."""
    objs = [item.obj]
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        for fdef in (info.name2fixturedefs.get(name, ()) if info else ()):
            objs.append(fdef.func)
    names = names_reached(objs) | set(item.fixturenames)
    found = {t for t, signs in NEEDS.items() if names & signs}
    found |= {m.name for m in item.iter_markers() if m.name in TIERS and m.name != "quick"}
    if found or names & PROCESS_NAMES or "attacker" in item.fixturenames:
        found.add("sandbox")
    return found or {"quick"}


class Guard:
    """While a `quick` test runs, starting a process fails it: the tier said it never would.
    (An audit hook cannot be removed, so it stays installed and checks a flag.)"""

    EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.system",
                        "os.exec", "os.spawn", "pty.spawn"})

    def __init__(self):
        self.active = None
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.active and event in self.EVENTS:
            name, self.active = self.active, None
            what = f"{event} {args[1] if event == 'subprocess.Popen' else ''}".strip()
            raise RuntimeError(f"{name} is in the quick tier but started a process ({what}): "
                               "mark it @pytest.mark.sandbox (the tier analysis in "
                               "tests/kit/tiers.py did not see it)")
