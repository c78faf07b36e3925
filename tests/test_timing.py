"""gptlib.timing: the alternating rounds the benchmarks and sweeps time their contenders in."""

import pytest

from gptlib import timing


class FakeClock:
    """time.perf_counter replaced by a clock that only the timed calls advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rounds_alternate_and_divide_by_the_work_per_call(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    order, synced, after = [], [], []

    def call(name, seconds):
        def run():
            order.append(name)
            clock.now += seconds

        return run

    times = timing.alternating_rounds(
        {"a": call("a", 2.0), "b": call("b", 6.0)},
        4,
        warmup=1,
        per_call=2,
        sync=lambda: synced.append(clock.now),
        after_round=lambda: after.append(len(order)),
    )
    assert order == ["a", "b"] + [
        "a",
        "b",
        "b",
        "a",
        "a",
        "b",
        "b",
        "a",
    ]  # warm-up, then alternating rounds
    assert times == {"a": [1.0] * 4, "b": [3.0] * 4}  # the warm-up is not timed
    assert len(synced) == 2 * 8 and after == [4, 6, 8, 10]


def test_bad_arguments_name_the_parameter():
    for kwargs, name in (
        ({"rounds": 0}, "rounds"),
        ({"rounds": 1, "per_call": 0}, "per_call"),
        ({"rounds": 1, "warmup": -1}, "warmup"),
    ):
        with pytest.raises(ValueError, match=name):
            timing.alternating_rounds({"a": lambda: None}, **kwargs)
    with pytest.raises(ValueError, match="calls"):
        timing.alternating_rounds({}, 1)


def test_what_is_not_callable_is_refused_before_anything_runs():
    """Every contender, ``sync`` and ``after_round`` is checked before the first call: a bad one
    found after the others' warm-up would have wasted the warm-up, and a list is not a mapping."""
    ran = []
    good = lambda: ran.append(1)  # noqa: E731
    for kwargs, name in (
        ({"calls": {"a": good, "b": 3}}, r"calls\['b'\]"),
        ({"calls": [good]}, "calls"),
        ({"calls": {"a": good}, "sync": 3}, "sync"),
        ({"calls": {"a": good}, "after_round": "x"}, "after_round"),
    ):
        with pytest.raises(ValueError, match=name):
            timing.alternating_rounds(**{"rounds": 1, **kwargs})
    assert ran == []
