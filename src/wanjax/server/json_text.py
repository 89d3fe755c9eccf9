"""JSON text a client sent (a request body, a form field holding JSON), read with a bound on how
deeply its arrays and objects nest.

The standard library's parser recurses once a level: text nested some thousand levels deep is a
``RecursionError``, and a value parsed just under the interpreter's limit breaks the next function
that walks it (the ``repr`` of an error message). A request's fields nest 3 levels at most
(``{"lora": [{"name": ...}]}``), so a value nested deeper than :data:`MAX_DEPTH` is refused whole,
before anything else reads it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects, far below the interpreter's recursion limit


class TooDeep(ValueError):
    """The JSON text nests arrays and objects more than :data:`MAX_DEPTH` levels deep."""

    def __init__(self) -> None:
        super().__init__(f"arrays and objects nested more than {MAX_DEPTH} levels deep")


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; :class:`TooDeep` for text nested more than :data:`MAX_DEPTH` levels
    (a ``ValueError``, as are ``JSONDecodeError`` and ``UnicodeDecodeError`` for text that is not
    JSON)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep from None
    if nested_deeper(value, MAX_DEPTH):
        raise TooDeep
    return value


def nested_deeper(value: Any, limit: int) -> bool:
    """``value`` (parsed JSON) has arrays or objects more than ``limit`` levels deep (walked without
    recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
