"""The service's whole-number settings from the environment: a bad value is an error that names the
variable and what it takes, which the service turns into one line before any worker starts."""

from __future__ import annotations

from collections.abc import Mapping


def whole_number(environ: Mapping[str, str], name: str, default: int, unit: str, takes: str, minimum: int = 0) -> int:
    """``environ[name]`` as a whole number of ``unit`` (at least ``minimum``), else ``default``.
    ``takes`` says what the error message adds in brackets, e.g. "0: never wait"."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) < minimum:
        raise ValueError(f"{name} must be a whole number of {unit} ({takes}), not {value!r}")
    return int(value)
