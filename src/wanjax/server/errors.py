"""The API's answer other than success."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ApiError(Exception):
    """An answer other than success: HTTP status, one-line message, OpenAI-style type and code (and
    the answer's headers, e.g. a 416's ``Content-Range``)."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
