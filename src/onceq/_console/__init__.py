"""The operator's console: a web page over the flows, their failures and their ledger.

    onceq console [FILE] [--db …] [--port 8025] [--host 127.0.0.1] [--read-only]

Served by onceq itself (aiohttp; the page is plain HTML, CSS and JavaScript shipped in
`static/`, no build step). The page reads a JSON API (`api.py`, described by the
OpenAPI document at /api/openapi.json, `openapi.py`) and never more than the API
gives: what is read comes from `onceq status`'s gather (`onceq._ops.status`), the
journeys from `onceq trace`'s (`onceq._ops.journey`), the dead letters and their
replays and purges from each source type (`onceq._sources.dead_api`), so the console
and the commands cannot disagree. Safety (`guard.py`): loopback by default, a token
for any other address, the token and a CSRF token on every change, `--read-only`
serves no change at all.
"""
