"""uvicorn's HTTP/1.1 protocol (h11), answering a request that is not valid HTTP with the API's JSON
error instead of uvicorn's plain-text 400: every answer of the server is one a client can parse."""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["JsonErrorH11Protocol"]


class JsonErrorH11Protocol(H11Protocol):
    """:class:`H11Protocol` whose 400 for malformed HTTP (a NUL or CR in a header, a broken request
    line: the app never sees it) is ``{"error": {"message", "type", "param", "code"}}``."""

    def send_400_response(self, msg: str) -> None:
        error = {"message": f"the request is not valid HTTP: {msg}", "type": "invalid_request_error"}
        body = json.dumps({"error": {**error, "param": None, "code": "malformed_http"}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()
