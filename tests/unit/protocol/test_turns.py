"""The turn budget (protocol/turns.py) on a clock the test moves: a read is split only
when its turn's time is spent, looked at every CHECK_EVERY frames, and never for a
read of CHECK_EVERY frames or fewer."""

from __future__ import annotations

from leveret.core.clock import ManualClock
from leveret.protocol.turns import CHECK_EVERY, TURN_BUDGET, TurnBudget


def frames_handled(budget: TurnBudget, count: int, clock: ManualClock, per_frame: float) -> int:
    """Frames handled before the budget says stop, each taking ``per_frame`` seconds."""
    for handled in range(count):
        if budget.spent():
            return handled
        clock.advance(per_frame)
    return count


def test_time_that_does_not_pass_never_ends_a_turn():
    clock = ManualClock()
    assert frames_handled(TurnBudget(10_000, clock.monotonic), 10_000, clock, 0.0) == 10_000


def test_a_turn_ends_at_the_first_look_past_the_budget():
    clock = ManualClock()
    per_frame = TURN_BUDGET / (3 * CHECK_EVERY + 1)  # spent during the fourth group of frames
    assert frames_handled(TurnBudget(1000, clock.monotonic), 1000, clock, per_frame) == 4 * CHECK_EVERY - 1


def test_a_read_of_check_every_frames_is_never_split():
    clock = ManualClock()
    assert frames_handled(TurnBudget(CHECK_EVERY, clock.monotonic), CHECK_EVERY, clock, 1.0) == CHECK_EVERY
