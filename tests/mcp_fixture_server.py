"""An upstream MCP server for the envgit mcp tests and benchmark: file and search tools over a
corpus directory. `python mcp_fixture_server.py CORPUS [--http PORT]` (stdio by default).

`create_note` and `delete_file` are the writes that policy rules deny or ask about; notes
go to CORPUS/../notes/, so a test can see whether a call really happened. `make_corpus`
writes the corpus the tests and the benchmark use."""

import re
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

TEMPLATE_FILE = "src/docs.js"


def make_corpus(base: Path) -> Path:
    """~250 KB of code whose `require(` lines a search returns, four files that really
    require node:http, and one that only mentions require('node:http') inside a template
    string (the case a too-broad regex gets wrong)."""
    corpus = base / "corpus"
    (corpus / "src").mkdir(parents=True)
    for i in range(40):
        lines = [f"const mod{i}_{j} = require('./lib/module_{i}_{j}');  // helper number {j} of file {i}"
                 for j in range(80)]
        if i % 10 == 0:
            lines.append("const http = require('node:http');")
        (corpus / "src" / f"file{i:02}.js").write_text("\n".join(lines) + "\n")
    (corpus / TEMPLATE_FILE).write_text(
        "const help = `To serve, write require('node:http') and call createServer`;\n"
        "module.exports = help;\n")
    return corpus


class FileInfo(BaseModel):
    path: str = Field(description="relative to the corpus root")
    bytes: int


class FileList(BaseModel):
    files: list[FileInfo]


class FileText(BaseModel):
    path: str
    text: str


class Hit(BaseModel):
    path: str
    line: int = Field(description="1-based line number")
    text: str = Field(description="the whole matching line")


class SearchResult(BaseModel):
    hits: list[Hit]
    truncated: bool = Field(description="true when max_hits stopped the search")


def build(root: Path) -> MCPServer:
    root = root.resolve()
    notes = root.parent / "notes"
    app = MCPServer("corpus")

    def inside(path: str) -> Path:
        p = (root / path).resolve()
        if root not in p.parents and p != root:
            raise ToolError(f"{path!r} is outside the corpus")
        return p

    @app.tool()
    def list_files(glob: str = Field("**/*", description="a glob under the corpus root")) -> FileList:
        """List the files of the corpus with their sizes."""
        return FileList(files=[FileInfo(path=str(p.relative_to(root)), bytes=p.stat().st_size)
                               for p in sorted(root.glob(glob)) if p.is_file()])

    @app.tool()
    def read_file(path: str = Field(description="relative to the corpus root")) -> FileText:
        """Read one file of the corpus whole."""
        return FileText(path=path, text=inside(path).read_text())

    @app.tool()
    def search(pattern: str = Field(description="a Python regular expression, matched per line"),
               max_hits: int = Field(100000, description="stop after this many hits")) -> SearchResult:
        """Search every line of every file of the corpus (grep -n)."""
        rx, hits = re.compile(pattern), []
        for p in sorted(root.rglob("*")):
            if not p.is_file():
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if rx.search(line):
                    if len(hits) >= max_hits:
                        return SearchResult(hits=hits, truncated=True)
                    hits.append(Hit(path=str(p.relative_to(root)), line=n, text=line))
        return SearchResult(hits=hits, truncated=False)

    @app.tool()
    def create_note(title: str, body: str) -> str:
        """Write a note next to the corpus (a write: policies gate it)."""
        notes.mkdir(exist_ok=True)
        (notes / f"{re.sub(r'[^A-Za-z0-9_-]', '_', title)}.md").write_text(body)
        return f"created note {title}"

    @app.tool()
    def delete_file(path: str) -> str:
        """Delete a file of the corpus (a write: policies gate it)."""
        inside(path).unlink()
        return f"deleted {path}"

    return app


if __name__ == "__main__":
    server = build(Path(sys.argv[1]))
    if sys.argv[2:3] == ["--http"]:
        import anyio
        anyio.run(lambda: server.run_streamable_http_async(host="127.0.0.1", port=int(sys.argv[3])))
    else:
        server.run()
