"""What an upgrade changes in a store that an earlier release made: before registration wrote the production
pointer, ``NAME:production`` meant the latest version until a first promotion. Now a name with no pointer
serves its first-registered version (a later fit waits for ``promote``), so a store never promoted under the
earlier release serves another version after the upgrade: said once, where a user starts and looks."""

from __future__ import annotations

from model_store import first_version, resolve_tag
from model_store.production import production_tag


def served_before(name: str) -> str | None:
    """One line when ``name`` has no pointer and its first-registered version (served now) is not its latest
    (what an earlier release served); None otherwise."""
    if production_tag(name) is not None or (first := first_version(name)) is None:
        return None
    try:
        latest = resolve_tag(f"{name}:latest")
    except Exception:  # a notice must never stop a start
        return None
    if latest == first:
        return None
    return (f"note: {name} has no production pointer (never promoted): production is its first registered version, "
            f"{first}. Releases before the pointer served the latest, {latest}; to serve it, compare and promote "
            f"it: `han-model promote {latest} --data FILE`")
