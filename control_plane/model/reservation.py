"""A reservation's id, pure: what a settle needs to find the reservation on any replica,
written into the id the reserve answered with, so no replica has to remember it.

``rsv1.<base64url of the fields, one per line>``: the namespace of the service that made it
(a settle on another namespace is refused), the route, the bucket key, where the distributed
store stood (``booked``: the reservation is in Redis; ``refused``: Redis refused it, there is
nothing to settle there; ``unasked``: Redis was not asked, the route was ``off``, or it could not
answer, so a settle charges the actual cost there in full, once), a random nonce (128 bits),
the reservation's id in the key's book, and, when the local and global answers were compared at
the reserve, how they compared and the minute it was made in (its settle corrects that minute's
divergence figures from the estimate to the actual cost). An id without the last two (five
fields: made before they were written) still settles. The nonce is what makes an id unguessable: knowing a
route and key is not enough to settle (or learn anything of) someone else's reservation.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_RESERVATION_LENGTH", "ReservationId", "Store", "new_nonce"]

Store = Literal["booked", "refused", "unasked"]

_PREFIX = "rsv1."
_STORES: dict[str, Store] = {"b": "booked", "r": "refused", "u": "unasked"}
_CODES = {v: k for k, v in _STORES.items()}
#: how the local and global answers compared at the reserve: agree, local_allow_distributed_deny,
#: local_deny_distributed_allow
_COMPARED = {"a": "agree", "l": "local_allow_distributed_deny", "r": "local_deny_distributed_allow"}
_COMPARED_CODES = {v: k for k, v in _COMPARED.items()}
_URLSAFE = str.maketrans("-_", "+/")
#: the longest id: a key of 65,536 characters (the longest a route may allow), a route and a
#: namespace of 64 each, the nonce, in base64
MAX_RESERVATION_LENGTH = 90_000


def new_nonce() -> str:
    """A reservation's nonce: 128 random bits, 22 characters of base64url."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationId:
    """A reservation's id, decoded (see the module docstring)."""

    namespace: str
    route: str
    key: str
    store: Store
    nonce: str
    compared: str | None = None  # a Divergence's value: how the answers compared at the reserve
    minute: int = 0  # the minute it was made in (Unix seconds), when compared

    def encode(self) -> str:
        parts = [self.namespace, self.route, self.key, _CODES[self.store], self.nonce]
        if self.compared is not None:
            parts += [_COMPARED_CODES[self.compared], str(self.minute)]
        return _PREFIX + base64.urlsafe_b64encode("\n".join(parts).encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> ReservationId:
        """The id's fields; ValueError saying why it is no reservation id of this service's
        making (never echoing it)."""
        if not text.startswith(_PREFIX) or len(text) > MAX_RESERVATION_LENGTH:
            raise ValueError("not a reservation id (a decision with an estimate answers with one)")
        body = text[len(_PREFIX) :]
        if "+" in body or "/" in body:  # base64url only (strict decoding below takes the standard alphabet)
            raise ValueError("not a reservation id: its body is not base64url text")
        try:
            padded = body.translate(_URLSAFE) + "=" * (-len(body) % 4)
            raw = binascii.a2b_base64(padded, strict_mode=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ValueError("not a reservation id: its body is not base64url text") from None
        parts = raw.split("\n")
        if len(parts) not in (5, 7) or parts[3] not in _STORES or not all(parts):
            raise ValueError("not a reservation id: its fields are not a namespace, route, key, store and nonce")
        namespace, route, key, code, nonce = parts[:5]
        compared, minute = None, 0
        if len(parts) == 7:
            how, when = parts[5:]
            if how not in _COMPARED or not when.isascii() or not when.isdigit() or len(when) > 12:
                raise ValueError("not a reservation id: its comparison is not one this service writes")
            compared, minute = _COMPARED[how], int(when)
        return cls(
            namespace=namespace, route=route, key=key, store=_STORES[code], nonce=nonce, compared=compared,
            minute=minute,
        )  # fmt: skip
