"""`envgit ui`: the session as a page, served on 127.0.0.1 with a token (commands/ui.py).

guard.py   who may talk to it (token, Host, same-origin changes, CSP and friends)
app.py     the routes, server-rendered (Jinja2), live by server-sent events
query.py   pages of steps from the journal, read-only, in SQL
stepview.py one step: its diff (envgit diff's code), its policy against the current one
templates/, static/  the HTML, one script and one stylesheet, shipped in the package

Imported only by `envgit ui`: Starlette, uvicorn, sse-starlette and Jinja2 never load on
the hot path.
"""
