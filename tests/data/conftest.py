"""Fixtures of the data tests: a local HTTP server standing in for the network."""

from __future__ import annotations

import http.server
import threading

import pytest

from helpers import TEXT


@pytest.fixture
def server():
    """Serves TEXT at /input.txt on 127.0.0.1 and counts the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path != "/input.txt":
                self.send_error(404)
                return
            body = TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()
    httpd.server_close()
