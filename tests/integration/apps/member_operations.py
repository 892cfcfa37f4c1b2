"""Which set operation each ledger input is, for tests/integration/apps/ledger_sets.py and
the test that checks it (importable without the app's environment)."""

from __future__ import annotations

#: each key's first events add members that no later event touches (only a restore of the
#: set keeps them after a crash: the inputs that added them are long committed)
EARLY_TURNS = 4


def operation(event_id: str, keys: int) -> tuple[str, str]:
    """The set operation of event ``e<n>``: ``n // keys`` is the event's place among its
    key's events (the traffic cycles over ``keys`` keys). The first :data:`EARLY_TURNS`
    add a member of their own; later ones add (two times in three) or discard one of 7
    members."""
    turn = int(event_id[1:]) // keys
    if turn < EARLY_TURNS:
        return "add", f"early{turn}"
    return ("discard" if turn % 3 == 0 else "add"), f"m{turn * 5 % 7}"
