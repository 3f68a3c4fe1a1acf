"""The profile's timeline (kbfuse.survey.profile): the GPU idle between kernels inside a
forward, measured on synthetic timelines (overlapping kernels, several streams, time before
the first kernel and after the last), and the profile of a forward on the CPU."""

from __future__ import annotations

import pytest

from kbfuse.survey import profile


def test_busy_time_is_the_union_of_the_intervals():
    assert profile.busy_us([]) == 0.0
    assert profile.busy_us([(0.0, 10.0), (20.0, 25.0)]) == 15.0
    # a kernel on a second stream overlapping two on the first, and one inside another
    assert profile.busy_us([(0.0, 10.0), (5.0, 30.0), (12.0, 20.0), (40.0, 41.0)]) == 31.0
    assert profile.busy_us([(5.0, 8.0), (0.0, 10.0)]) == 10.0


def test_gaps_inside_each_forward_not_before_its_first_kernel_nor_after_its_last():
    windows = [(0.0, 100.0), (100.0, 200.0)]
    activity = [
        # forward 0: host range starts at 0, first kernel at 10 (not a gap), last ends at 60
        (10.0, 20.0),
        (25.0, 40.0),  # a 5 us gap before it
        (30.0, 50.0),  # another stream, overlapping: 10 us more busy
        (55.0, 60.0),  # a 5 us gap before it; then nothing until the window's end
        # forward 1: two kernels, one gap of 20 us
        (110.0, 130.0),
        (150.0, 170.0),
    ]
    gaps = profile.forward_gaps(windows, activity)
    # forward 0: span 50, busy 10 + 25 + 5 = 40, idle 10; forward 1: span 60, busy 40, idle 20
    assert gaps == {
        "forwards": 2,
        "span_us": 55.0,
        "busy_us": 40.0,
        "idle_us": 15.0,
        "unassigned": 0,
    }


def test_events_outside_every_forward_are_counted_apart():
    gaps = profile.forward_gaps([(0.0, 10.0)], [(1.0, 2.0), (4.0, 6.0), (50.0, 60.0)])
    assert gaps == {"forwards": 1, "span_us": 5.0, "busy_us": 3.0, "idle_us": 2.0, "unassigned": 1}


def test_no_device_event_in_any_forward_gives_no_timeline():
    assert profile.forward_gaps([(0.0, 10.0)], []) is None
    assert profile.forward_gaps([], [(0.0, 1.0)]) is None


def test_forwards_without_device_events_do_not_dilute_the_average():
    gaps = profile.forward_gaps([(0.0, 10.0), (10.0, 20.0)], [(1.0, 3.0), (5.0, 6.0)])
    assert gaps["forwards"] == 1 and gaps["idle_us"] == pytest.approx(2.0)


def test_a_cpu_profile_lists_operators_but_neither_its_own_ranges_nor_a_timeline():
    import torch

    x = torch.rand(8, 8)
    kernels, timeline = profile.profile_forward(lambda: torch.tanh(x @ x), "cpu", forwards=2)
    names = {k["name"] for k in kernels}
    assert {"aten::mm", "aten::tanh"} <= names
    assert not any(name.startswith(profile.MARK) for name in names)
    assert timeline is None
