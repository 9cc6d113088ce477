"""How long a control call to a server may take."""

from __future__ import annotations

#: The time a control call to a Triton server (health, repository index, model list) may take, outside a start-up
#: poll: a server that is up answers at once, so this only bounds the wait on one that hangs.
CONTROL_TIMEOUT_S = 10.0
