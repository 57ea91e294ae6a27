"""Reading the fields of a control-API request body: each check raises ApiError (400) naming the
field, so every route (the API's own and the lease manager's) refuses bad input the same way."""

from __future__ import annotations

import json
from typing import Any

from gpuctl.daemon.errors import ApiError
from gpuctl.model import MAX_REQUEST_ID_CHARS

#: Longest string accepted in any body field (names, ids), characters.
MAX_STRING_CHARS = 256
#: Largest generation accepted (a signed 64-bit counter).
MAX_GENERATION = 2**63 - 1


def printable(text: str, limit: int = 300) -> str:
    """`text` with every non-printable character (control characters, lone surrogates, bidi
    controls) written as a backslash escape, cut to `limit` characters: safe for a log line."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:limit])
    return out + ("..." if len(text) > limit else "")


_TYPE_WORDS = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def get_field(data: dict[str, Any], key: str, typ: type, where: str, *, required: bool = True, default: Any = None) -> Any:
    """data[key] checked to be of `typ` (a string also by check_text); `default` when absent and
    not `required`. ApiError 400 missing_field / invalid_field naming `where`."""
    if key not in data:
        if required:
            raise ApiError(400, "missing_field", f"{where} is required", where)
        return default
    value = data[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ApiError(
            400, "invalid_field", f"{where} must be {_TYPE_WORDS[typ]}, got {json.dumps(value)[:80]}", where
        )
    if typ is str:
        check_text(value, where)
    return value


def check_text(value: str, where: str) -> None:
    """Every string field: not empty, at most MAX_STRING_CHARS, printable (no control characters,
    lone surrogates or bidi controls, which would corrupt logs, terminals and the state file), no
    spaces at either end (names that look alike must be alike)."""
    if not value.strip():
        raise ApiError(400, "invalid_field", f"{where} must not be empty", where)
    if len(value) > MAX_STRING_CHARS:
        raise ApiError(400, "invalid_field", f"{where} is longer than {MAX_STRING_CHARS} characters", where)
    if not value.isprintable():
        bad = next(ch for ch in value if not ch.isprintable())
        raise ApiError(400, "invalid_field",
                       f"{where} must be printable text; it holds {ascii(bad)} ({printable(value, 80)!r})", where)
    if value != value.strip():
        raise ApiError(400, "invalid_field", f"{where} must not start or end with spaces, got {value!r}", where)


def no_unknown_fields(data: dict[str, Any], allowed: set[str], prefix: str = "") -> None:
    """ApiError 400 unknown_field naming the first key of `data` not in `allowed`."""
    for key in data:
        if key not in allowed:
            where = f"{prefix}{key}"
            raise ApiError(
                400, "unknown_field", f"{where} is not a field of this request (allowed: {', '.join(sorted(allowed))})",
                where,
            )


def request_id_field(data: dict[str, Any]) -> str:
    """The body's request_id: a string of at most MAX_REQUEST_ID_CHARS (ApiError 400)."""
    rid = get_field(data, "request_id", str, "request_id")
    if len(rid) > MAX_REQUEST_ID_CHARS:
        raise ApiError(400, "invalid_field", f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters", "request_id")
    return rid


def generation_field(data: dict[str, Any]) -> int:
    """The body's generation: an integer 0..MAX_GENERATION (ApiError 400)."""
    gen = get_field(data, "generation", int, "generation")
    if gen < 0:
        raise ApiError(400, "invalid_field", f"generation must be >= 0, got {gen}", "generation")
    if gen > MAX_GENERATION:
        raise ApiError(400, "invalid_field", f"generation must be <= {MAX_GENERATION}, got {str(gen)[:40]}...",
                       "generation")
    return gen
