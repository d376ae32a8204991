"""What a project's policy makes the host read, run or connect to (policy/hostentries.py lists
it: credentials, MCP servers): approved by the person (trust.py, `envgit trust`); commands then
run from outside the project (run.py), for credentials' `from: command`
(credentials/source.py) and MCP stdio servers (mcp/upstream.py), and a url server's `${VAR}`s
are expanded there too. Neither trusts a place a step of the project can write (writable.py)."""
