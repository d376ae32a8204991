"""envgit mcp's `execute` beside calling the upstream tools directly, for one fixed task over
the fixture corpus (tests/mcp_fixture_server.py): "which files require node:http, and how
many require lines are there?"

    .venv/bin/python bench/bench_mcp.py [--runs N]

Bytes: what reaches the model. Directly, that is every tool result's text (the way an MCP
client hands results to the model), for two ways of doing the task: one search, or
list_files and then read_file of every file. Via execute, it is the text execute returns.
Time: medians of N runs (default 15), all in this run: a direct search call; a warm execute
doing the same search (REPL alive); the same after a reset (a new bwrap sandbox and node
process first); and an execute of `1`, warm (the step's own cost: record, snapshot) and
cold (that plus the sandbox and node start).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mcp import Client, StdioServerParameters  # noqa: E402

from mcp_fixture_server import make_corpus  # noqa: E402

ENVGIT = str(Path(sys.executable).parent / "envgit")
FIXTURE = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_fixture_server.py")
SEARCH = {"pattern": r"require\("}
CODE = ("const r = await corpus.search({pattern: 'require\\\\('});\n"
        "const http = [...new Set(r.hits.filter(h => /require\\('node:http'\\)/.test(h.text)).map(h => h.path))];\n"
        "({requires: r.hits.length, http})")


def text_bytes(result) -> int:
    return sum(len(b.text.encode()) for b in result.content if b.type == "text")


async def timed(fn, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


async def measure(root: Path, corpus: Path, runs: int):
    direct = Client(StdioServerParameters(command=sys.executable, args=[FIXTURE, str(corpus)]))
    ours = Client(StdioServerParameters(command=ENVGIT, args=["mcp"], cwd=str(root)))
    async with direct, ours:
        # bytes: the same answer three ways
        search = await direct.call_tool("search", SEARCH)
        files = (await direct.call_tool("list_files", {})).structured_content["files"]
        reads = [await direct.call_tool("read_file", {"path": f["path"]}) for f in files]
        listing = await direct.call_tool("list_files", {})
        via = await ours.call_tool("execute", {"code": CODE})
        if via.is_error:
            raise SystemExit(f"execute failed: {via.content[0].text}")
        bytes_rows = [("direct: search", text_bytes(search), 1),
                      ("direct: list_files + read_file each", text_bytes(listing) + sum(map(text_bytes, reads)),
                       1 + len(reads)),
                      ("envgit mcp: execute (search in the sandbox)", text_bytes(via), 1)]

        async def direct_search():
            await direct.call_tool("search", SEARCH)

        async def warm():
            await ours.call_tool("execute", {"code": CODE})

        async def cold():
            await ours.call_tool("execute", {"code": CODE, "reset": True})

        async def trivial():
            await ours.call_tool("execute", {"code": "1"})

        async def trivial_cold():
            await ours.call_tool("execute", {"code": "1", "reset": True})
        time_rows = [("direct: search call", await timed(direct_search, runs)),
                     ("execute, warm REPL (same search)", await timed(warm, runs)),
                     ("execute, cold (new sandbox + node)", await timed(cold, runs)),
                     ("execute of `1`, warm (the step's own cost)", await timed(trivial, runs)),
                     ("execute of `1`, cold (+ sandbox and node start)", await timed(trivial_cold, runs))]
    return bytes_rows, time_rows, via.content[0].text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-bench-mcp-") as tmp:
        root = Path(tmp) / "proj"
        root.mkdir()
        corpus = make_corpus(Path(tmp))
        subprocess.run([ENVGIT, "init"], cwd=root, capture_output=True, check=True)
        with open(root / "envgit.yaml", "a") as f:
            f.write(f"\nmcp:\n  servers:\n    corpus: {{command: {sys.executable}, args: [{FIXTURE}, {corpus}]}}\n")
        try:
            bytes_rows, time_rows, answer = anyio.run(measure, root, corpus, args.runs)
        finally:
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, capture_output=True)
    print(f"task: which files require node:http, and how many require lines? (execute answered {answer})")
    anchor = bytes_rows[0][1]
    print(f"\n{'bytes that reach the model':<46} {'bytes':>9} {'calls':>6} {'x direct search':>16}")
    for name, n, calls in bytes_rows:
        print(f"{name:<46} {n:>9} {calls:>6} {n / anchor:>16.4f}")
    anchor = time_rows[0][1]
    print(f"\n{f'wall time, median of {args.runs}':<46} {'ms':>9} {'':>6} {'x direct search':>16}")
    for name, ms in time_rows:
        print(f"{name:<46} {ms:>9.1f} {'':>6} {ms / anchor:>16.2f}")


if __name__ == "__main__":
    main()
