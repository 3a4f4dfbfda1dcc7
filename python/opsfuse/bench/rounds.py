"""The order in which interleaved timings run their contenders, round by round.

Where each call lasts milliseconds, what ran just before a timing moves it: a slow peer rests the
card, whose clock then boosts, and a fast one heats it towards its power cap. The rounds here are
balanced for that carry-over, so that it falls on every contender alike.
"""

from __future__ import annotations


def round_order(names, r):
    """The order of round r in an interleaved timing: every name once. The rounds follow a Williams
    design (a balanced Latin square): over one cycle (cycle_length rounds) every name comes first
    equally often and runs right after every other name equally often. (The plain rotation used
    before session 52 kept each name's predecessor fixed: in the prefill grid opsfuse's default row
    always followed the memory-efficient kernel, and its out= row always followed opsfuse.)"""
    n = len(names)
    if n < 2:
        return list(names)
    base, lo, hi = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...: each step between names once
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    k = r % cycle_length(n)
    order = [(i + k) % n for i in base]
    if k >= n:  # odd counts: the mirrored rows complete the balance
        order.reverse()
    return [names[i] for i in order]


def cycle_length(n):
    """Rounds of one balanced cycle of round_order for n names (one name: a single round)."""
    if n < 2:
        return 1
    return n if n % 2 == 0 else 2 * n


def whole_cycles(repeat, n):
    """`repeat` rounded up to whole cycles of round_order, so that the balance holds in every median."""
    cycle = cycle_length(n)
    return -(-repeat // cycle) * cycle
