"""An HTTP endpoint on the loopback address that stalls: for the tests of a store that stops
answering. Requests it does not stall go on to a real server (tests/s3server.py's moto).

    with Stalling() as endpoint:                       # accepts connections, never answers
        os.environ["AWS_ENDPOINT_URL"] = endpoint.url
    with Stalling(trickle=0.1) as endpoint:            # answers a byte every 0.1 s, never finishing
    with Stalling(upstream=server.endpoint, stalls=lambda request: "partNumber=2" in request):
        ...                                            # moto's answers, but part 2 gets none

`stalls(request_line)` picks the requests to stall ("PUT /bucket/key?partNumber=2&... HTTP/1.1");
`stalled` lists those it held. Leaving the block closes every connection, so a client still
waiting on one sees it end.
"""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# the start of an answer that never ends: each byte comes in well inside any read timeout
SLOW_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n" + b"X-Slow: " + b"." * 100_000


def everything(request_line: str) -> bool:
    return True


@dataclass
class Stalling:
    upstream: str | None = None  # http://127.0.0.1:PORT of the server the other requests go to
    stalls: object = everything  # request line -> whether to stall it
    trickle: float | None = None  # seconds between the bytes of a slow answer; None: no answer at all
    stalled: list = field(default_factory=list)

    def __enter__(self) -> "Stalling":
        self.closing = threading.Event()
        self.sockets: list[socket.socket] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        for sock in [self.listener, *self.sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Requests of one connection, in turn, until one is stalled or the connection ends."""
        upstream = None
        try:
            reader = client.makefile("rb")
            while not self.closing.is_set():
                head, line, headers = read_head(reader)
                if head is None:
                    return
                if self.stalls(line):
                    self.stalled.append(line)
                    self._stall(client)
                    return
                if headers.get("expect", "").lower() == "100-continue":  # botocore's uploads ask first
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = re.sub(rb"(?im)^expect:[^\n]*\n", b"", head)
                if upstream is None:
                    address = urlsplit(self.upstream)
                    upstream = socket.create_connection((address.hostname, address.port))
                    self.sockets.append(upstream)
                    answers = upstream.makefile("rb")
                upstream.sendall(head + read_body(reader, headers))
                answer, _, answer_headers = read_head(answers)
                client.sendall(answer + read_body(answers, answer_headers, head_request=line.startswith("HEAD ")))
        except OSError:
            return

    def _stall(self, client: socket.socket) -> None:
        if self.trickle is None:
            self.closing.wait()
            return
        for byte in SLOW_ANSWER:
            if self.closing.wait(self.trickle):
                return
            client.sendall(bytes([byte]))


def read_head(reader) -> tuple[bytes | None, str, dict]:
    """(the raw bytes of an HTTP message's first line and headers, its first line, its headers
    by lowercase name), or (None, "", {}) at the end of the connection."""
    first = reader.readline()
    if not first:
        return None, "", {}
    lines = [first]
    while lines[-1] not in (b"\r\n", b"\n", b""):
        lines.append(reader.readline())
    headers = {}
    for raw in lines[1:-1]:
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return b"".join(lines), first.decode("latin-1").strip(), headers


def read_body(reader, headers: dict, head_request: bool = False) -> bytes:
    """The raw bytes of the body that follows those headers (none in an answer to HEAD)."""
    if head_request:
        return b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return _chunks(reader)
    return reader.read(int(headers.get("content-length", 0)))


def _chunks(reader) -> bytes:
    """A chunked body as it came, trailer included."""
    parts = []
    while True:
        size_line = reader.readline()
        parts.append(size_line)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            while True:
                trailer = reader.readline()
                parts.append(trailer)
                if trailer in (b"\r\n", b"\n", b""):
                    return b"".join(parts)
        parts.append(reader.read(size + 2))
