"""A reservation's id (control_plane/model/reservation.py): what a settle needs to find it, read
back exactly, and anything else refused with a reason that never echoes the text."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.model.reservation import MAX_RESERVATION_LENGTH, ReservationId, new_nonce

_printable = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=300)


@given(namespace=_printable, route=_printable, key=_printable, store=st.sampled_from(["booked", "refused", "unasked"]))
def test_an_id_reads_back_as_it_was_made(namespace, route, key, store):
    rid = ReservationId(namespace=namespace, route=route, key=key, store=store, nonce=new_nonce())
    text = rid.encode()
    assert text.startswith("rsv1.") and "=" not in text and ReservationId.decode(text) == rid


@given(
    compared=st.sampled_from(["agree", "local_allow_distributed_deny", "local_deny_distributed_allow"]),
    minute=st.integers(0, 10**10).map(lambda m: m * 60),  # to the year 20,000 and more: 12 digits
)
def test_an_id_carries_how_its_answers_compared_and_its_minute(compared, minute):
    rid = ReservationId(namespace="ns", route="chat", key="acme", store="booked", nonce=new_nonce(),
                        compared=compared, minute=minute)  # fmt: skip
    assert ReservationId.decode(rid.encode()) == rid


def test_an_id_made_before_comparisons_were_written_still_reads():
    five = _b64(b"ns\nchat\nacme\nb\n" + new_nonce().encode())
    rid = ReservationId.decode(five)
    assert (rid.route, rid.store, rid.compared, rid.minute) == ("chat", "booked", None, 0)


def test_nonces_are_128_random_bits():
    nonces = {new_nonce() for _ in range(1000)}
    assert len(nonces) == 1000 and {len(n) for n in nonces} == {22}


def _b64(raw: bytes) -> str:
    return "rsv1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not a reservation id (a decision"),
        ("rsv2.abc", "not a reservation id (a decision"),
        ("rsv1." + "A" * MAX_RESERVATION_LENGTH, "not a reservation id (a decision"),
        ("rsv1.!!!!", "not base64url"),
        ("rsv1.ab+/", "not base64url"),  # the standard alphabet's characters are not url-safe ones
        (_b64(b"\xff\xfe\x00"), "not base64url text"),
        (_b64(b"ns\nroute\nkey\nb"), "its fields are not"),
        (_b64(b"ns\nroute\nkey\nx\nnonce"), "its fields are not"),
        (_b64(b"ns\n\nkey\nb\nnonce"), "its fields are not"),
        (_b64(b"ns\nroute\nkey\nb\nnonce\nmore"), "its fields are not"),
        (_b64(b"ns\nroute\nkey\nb\nnonce\nx\n60"), "its comparison is not"),
        (_b64(b"ns\nroute\nkey\nb\nnonce\nl\n-60"), "its comparison is not"),
        (_b64(b"ns\nroute\nkey\nb\nnonce\nl\n" + "\u0663".encode() * 2), "its comparison is not"),
        (_b64(b"ns\nroute\nkey\nb\nnonce\nl\n" + b"9" * 13), "its comparison is not"),
    ],
)
def test_anything_else_is_refused_saying_why_without_echoing_it(text, says):
    with pytest.raises(ValueError, match="not a reservation id") as err:
        ReservationId.decode(text)
    assert says in str(err.value) and (not text or text[5:] not in str(err.value))
