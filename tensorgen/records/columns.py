"""Reading one column of a stored row: text that is not UTF-8 and JSON that does not parse are named, not raised
from deep inside SQLite or json (see SQLiteDatabase, which skips such a row and counts it)."""

from __future__ import annotations

import json
from typing import Any


class Undecodable(str):
    """A TEXT value whose bytes are not UTF-8 (held with replacement characters, to be reported, never used)."""


def decode_text(raw: bytes) -> str:
    """The connection's text factory: a non-UTF-8 value is marked instead of failing the whole query."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return Undecodable(raw.decode(errors="replace"))


class RowFault(Exception):
    """Why a stored row cannot be read: `kind` groups the warnings, `reason` names the column and the damage."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def json_column(name: str, value: object) -> object:
    """The JSON value of column `name`, or a RowFault saying why it has none."""
    if isinstance(value, Undecodable):
        raise RowFault("not UTF-8", f"{name} holds bytes that are not UTF-8")
    try:
        return json.loads(value)
    except (TypeError, ValueError) as err:
        raise RowFault("invalid JSON", f"{name} is not valid JSON ({err})") from None


def json_object(value: object) -> dict[str, Any]:
    """A JSON object column of the runs table as a dict; {} for NULL or anything damaged (a run is only shown)."""
    try:
        data = json.loads(value) if isinstance(value, str) and not isinstance(value, Undecodable) else None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
