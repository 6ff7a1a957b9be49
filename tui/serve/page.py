"""The page `trackside serve` sends: textual-serve's terminal, and what it lacks.

textual-serve's script draws the terminal and, when its socket closes, only marks the
page closed. This page watches the socket itself (its script opens it with
`new WebSocket`, wrapped here before the script loads) and says why it closed: the
dashboard quit (q), the viewer cap, or a lost connection, which it retries with a
growing pause, polling /alive, until the server answers and has room; then it loads
the page again, which starts a fresh dashboard. Fonts come from textual-serve's
package: the page asks nothing of any other server.
"""

from __future__ import annotations

import html

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="/static/css/xterm.css">
<style>
  @font-face {{ font-family: "Roboto Mono"; src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }}
  @font-face {{ font-family: "Roboto Mono"; font-style: italic; src: url("/static/fonts/RobotoMono-Italic-VariableFont_wght.ttf"); }}
  html, body {{ margin: 0; height: 100%; background: #0c181f; }}
  #terminal {{ width: 100vw; height: 100vh; }}
  #status {{
    position: fixed; top: 0; left: 0; right: 0; z-index: 20; display: none;
    padding: 10px 16px; font: 15px "Roboto Mono", monospace;
    color: #fff; background: #7a4a00; box-shadow: 0 2px 8px #000a;
  }}
  #status.-error {{ background: #7a1020; }}
  #status button {{ margin-left: 16px; font: inherit; padding: 2px 12px; cursor: pointer; }}
  body.-lost #terminal {{ opacity: 0.45; }}
</style>
<script>
(() => {{
  const FULL = {full}, ENDED = {ended};
  const Native = window.WebSocket;
  let lostAt = 0, attempt = 0;

  function show(text, {{ error = false, button = null }} = {{}}) {{
    const status = document.getElementById("status");
    status.textContent = text;
    status.classList.toggle("-error", error);
    if (button) {{
      const b = document.createElement("button");
      b.textContent = button;
      b.onclick = () => location.reload();
      status.appendChild(b);
    }}
    status.style.display = "block";
    document.body.classList.add("-lost");
  }}

  async function retry(why) {{
    attempt += 1;
    const pause = Math.min(1000 * 2 ** (attempt - 1), 10000);
    let state = why;
    try {{
      const answer = await fetch("/alive", {{ cache: "no-store" }});
      if (answer.status === 403) {{
        show("The server refused this page's token: open the address `trackside serve` printed.", {{ error: true }});
        return;
      }}
      if (answer.status === 503) {{
        state = "Connection lost: the server is stopping";
      }} else {{
        const alive = await answer.json();
        if (alive.viewers < alive.max_viewers) {{ location.reload(); return; }}
        state = `${{alive.viewers}} pages are open: the cap is ${{alive.max_viewers}} (--max-viewers). Waiting for a place`;
      }}
    }} catch (e) {{
      state = "Connection lost: the server does not answer";
    }}
    const since = Math.round((Date.now() - lostAt) / 1000);
    show(`${{state}} — try ${{attempt}}, ${{since}} s since it closed; next in ${{pause / 1000}} s.`, {{ button: "Retry now" }});
    setTimeout(() => retry(why), pause);
  }}

  function closed(event) {{
    window.tracksideClosed = {{ code: event.code, reason: event.reason }};
    lostAt = Date.now();
    if (event.code === 1000) {{
      show("The dashboard quit.", {{ button: "Open it again" }});
    }} else if (event.code === ENDED) {{
      show(event.reason || "The dashboard process ended.", {{ error: true, button: "Open it again" }});
    }} else if (event.code === FULL) {{
      retry(event.reason);
    }} else {{
      retry("Connection lost");
    }}
  }}

  // The terminal script opens its socket with `new WebSocket(url)`: the one seen here.
  window.WebSocket = function (url, protocols) {{
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    socket.addEventListener("open", () => {{ window.tracksideOpen = true; }});
    socket.addEventListener("close", closed);
    return socket;
  }};
  Object.assign(window.WebSocket, {{ CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 }});
  window.WebSocket.prototype = Native.prototype;
}})();
</script>
<script src="/static/js/textual.js"></script>
</head>
<body>
<div id="status"></div>
<div id="terminal" class="textual-terminal" data-font-size="{font_size}"></div>
<script>
  // An address of this page, so an `ssh -L` to another local port still reaches it.
  document.getElementById("terminal").dataset.sessionWebsocketUrl =
    (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
</script>
</body>
</html>
"""


def page(title: str, font_size: int, full: int, ended: int) -> str:
    return PAGE.format(title=html.escape(title), font_size=font_size, full=full, ended=ended)
