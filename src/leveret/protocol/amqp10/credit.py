"""Link credit arithmetic (§2.6.7) shared by the broker's sending links."""

from __future__ import annotations

_UINT = 2**32


def credit_left(receiver_count: int, link_credit: int, sender_count: int) -> int:
    """A sender's link credit from the receiver's flow (§2.6.7): ``link_credit`` less
    the deliveries sent that the receiver's ``delivery-count`` had not seen yet, in
    serial-number arithmetic (RFC 1982), so any uint credit (up to 2**32 - 1) and a
    count that wrapped work; a receiver's count ahead of the sender's is taken as equal."""
    in_flight = (sender_count - receiver_count) % _UINT
    if in_flight >= 2**31:  # the receiver counted more than was sent
        in_flight = 0
    return max(0, link_credit - in_flight)
