"""Host commands a policy names (policy/hostcmds.py lists them): approved by the person
(trust.py, `envgit trust`), then run from outside the project (run.py), for credentials'
`from: command` (credentials/source.py) and MCP stdio servers (mcp/upstream.py)."""
