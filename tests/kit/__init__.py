"""What the tests share: their tiers (tiers.py), machine-wide locks (locks.py), the test users
(users.py), the `s3` and `remote` fixtures (s3.py, git_remote.py), the WebSocket server and
client the credential attacks use (websocket.py), a port for a server named before it listens
(ports.py). docs/TESTING.md says how they fit."""
