"""The numbers of a config file's table of limits (``[http]``, ``[login_throttle]``):
every key known, every value of its key's type (an int is taken where a float is
wanted, a boolean never), as the keyword arguments of the settings' dataclass."""

from __future__ import annotations

from collections.abc import Mapping


def numbers(section: str, table: object, kinds: Mapping[str, type]) -> dict[str, int | float]:
    """``table``'s values by key, each converted to its type in ``kinds``. ValueError
    naming ``section`` and the key when ``table`` is not a table, or a key is unknown
    or ill-typed (ranges are the caller's to check)."""
    if not isinstance(table, dict):
        raise ValueError(f"[{section}] must be a table")
    values: dict[str, int | float] = {}
    for key, value in table.items():
        kind = kinds.get(key)
        if kind is None:
            raise ValueError(f"unknown key {section}.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ValueError(f"{section}.{key} must be {kind.__name__}")
        values[key] = kind(value)
    return values
