"""The dashboard in a browser page (`trackside serve`, tui/commands/serve.py).

textual-serve (the `serve` extra) runs one dashboard process per browser connection and
relays its screen over a websocket. Each process opens its own SSH connection to every
host and polls it, so N viewers are N times the load on the GPU boxes: docs/serve.md
measures it, and viewers are capped (`--max-viewers`).

The web server is ours (tui/serve/server.py), on textual-serve's public parts: its
AppService, its terminal page's script and fonts. That way every request passes one
guard (the token, the Host and Origin headers), the page reconnects by itself, and a
browser that vanishes mid-stream ends its dashboard process.
"""
