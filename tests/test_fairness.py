"""Scheduler fairness (server/engine/scheduler.py): a waiting newcomer moves every over-budget group aside, and the
background lane gets no more decode time than the foreground, so a cheap request beside expensive ones
runs at about half its idle speed (bench/head_of_line.py measures it served: 17x -> 2.7x its idle time)."""

from __future__ import annotations

from test_length_split import join, scheduler


def test_a_newcomer_that_does_not_fit_moves_every_over_budget_group_aside():
    s = scheduler(max_rows=8, fair_share_row_steps=10)
    heavy = [join(s.foreground, 9, 9, 9, 9) for _ in range(2)]
    for group in heavy:
        group.row_steps = 11
    s.make_room(1)
    # Both moved, though one would have made room: the newcomer must not step at the pace of the other.
    assert s.background.groups == heavy and not s.foreground
    fresh = join(s.foreground, 9, 9, 9, 9)  # within its share: stays
    s.make_room(8)
    assert s.foreground.groups == [fresh]


def test_nothing_moves_while_the_newcomer_fits():
    s = scheduler(max_rows=8, fair_share_row_steps=10)
    heavy = join(s.foreground, 9, 9)
    heavy.row_steps = 99
    s.make_room(1)
    assert s.foreground.groups == [heavy] and not s.background


def test_the_background_steps_only_while_it_has_had_no_more_time_than_the_foreground():
    s = scheduler(max_rows=8)
    join(s.foreground, 5)
    join(s.background, 50, 50, 50, 50)
    turns = []
    for _ in range(10):
        lanes = s.turn()
        turns.append(s.background in lanes)
        for lane in lanes:  # a background step costs 4 foreground steps
            s.stepped(lane, 4.0 if lane is s.background else 1.0)
    assert turns == [True, False, False, False] * 2 + [True, False]  # equal time: 4 foreground steps to 1
    s.foreground.groups.clear()
    assert s.turn() == [s.background]  # alone, it steps every round
