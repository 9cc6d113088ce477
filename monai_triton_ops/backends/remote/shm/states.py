"""A shared memory region's states and the moves between them (``owner.py`` makes every move, and draws them)."""

from __future__ import annotations

import enum


class State(enum.Enum):
    CREATED = "created"
    ANNOUNCED = "announced"
    IDLE = "idle"
    IN_USE = "in use"
    LEASED = "leased"
    RELEASING = "releasing"
    UNREGISTERING = "unregistering"
    UNREGISTERED = "unregistered"
    UNLINKED = "unlinked"
    HANDED_OFF = "handed off"


#: Every legal move: state -> the states it may go to.
MOVES: dict[State, frozenset[State]] = {
    State.CREATED: frozenset({State.ANNOUNCED, State.UNLINKED}),
    State.ANNOUNCED: frozenset({State.IN_USE, State.HANDED_OFF}),
    State.IDLE: frozenset({State.IN_USE, State.RELEASING, State.HANDED_OFF}),
    State.IN_USE: frozenset({State.IDLE, State.LEASED, State.RELEASING, State.HANDED_OFF}),
    State.LEASED: frozenset({State.IDLE, State.RELEASING, State.HANDED_OFF}),
    State.RELEASING: frozenset({State.UNREGISTERING, State.HANDED_OFF}),
    State.UNREGISTERING: frozenset({State.UNREGISTERED, State.RELEASING, State.HANDED_OFF}),
    State.UNREGISTERED: frozenset({State.UNLINKED}),
    State.UNLINKED: frozenset(),
    State.HANDED_OFF: frozenset(),
}
ENDED = frozenset({State.UNLINKED, State.HANDED_OFF})
#: States after which a close or the exit sweep has taken the region from the request path.
TAKEN = frozenset({State.RELEASING, State.UNREGISTERING, State.UNREGISTERED, *ENDED})
#: Registered regions the server is done with: the exit sweep unregisters them rather than hand them off.
UNUSED = frozenset({State.IDLE, State.LEASED})
