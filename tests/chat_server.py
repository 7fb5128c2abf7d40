"""A chat-completions server on loopback, scripted per request: what the judge's and the proposer's tests talk to."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """Answers each POST with the next scripted (status, reply text or body, headers); records the requests.

    A status may also be a misbehaviour: ``"trickle"`` sends a success one
    byte every 50 ms, ``"trickle_headers"`` sends its status line and
    headers that way, ``"stall"`` sends nothing for 30 s, ``"garbage"``
    answers bytes that are not HTTP, ``"html"`` a 200 with an HTML page and
    ``"json"`` a 200 with the JSON object given. A reply given as a function
    is called with the request's headers (an endpoint that echoes them).
    """

    def __init__(self, script):
        self.script, self.requests = list(script), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                headers = {k.lower(): v for k, v in self.headers.items()}
                owner.requests.append(
                    (self.path, headers, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                )
                status, answer, extra = owner.script.pop(0)
                if callable(answer):
                    answer = answer(headers)
                if status == "garbage":
                    self.wfile.write(b"SSH-2.0-not-http\r\n\r\n")
                    return
                if status == "stall":
                    time.sleep(30)
                    return
                if status == "html":
                    body, kind = f"<html><body>{answer}</body></html>".encode(), "text/html"
                elif status == "json":
                    body, kind = json.dumps(answer).encode(), "application/json"
                elif status in (200, "trickle", "trickle_headers"):
                    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
                    kind = "application/json"
                else:
                    body, kind = json.dumps({"error": answer}).encode(), "application/json"
                head = [f"HTTP/1.1 {status if isinstance(status, int) else 200} OK", f"Content-Type: {kind}",
                        f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in extra.items())]  # fmt: skip
                head_bytes = ("\r\n".join(head) + "\r\n\r\n").encode()
                try:
                    if status == "trickle_headers":
                        self._trickle(head_bytes)
                        self.wfile.write(body)
                    elif status == "trickle":
                        self.wfile.write(head_bytes)
                        self._trickle(body)
                    else:
                        self.wfile.write(head_bytes + body)
                except OSError:  # the client gave up
                    pass
                self.close_connection = True

            def _trickle(self, data):
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.05)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
