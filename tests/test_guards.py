"""The windowed threshold alarm behind every silent-failure guard (metrics/guards.py)."""

from __future__ import annotations

import logging

import pytest

from rlgate.metrics.guards import Guard, GuardSet, GuardSpec

SPEC = GuardSpec("empty_replies", "empty replies", "replies", threshold=0.25, min_events=4)


def alarms(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rlgate.guards" and r.levelno == logging.WARNING]


def test_fires_only_above_the_threshold_with_enough_events(caplog):
    g = Guard(SPEC, window=100)
    g.observe(1, 1)
    assert not g.firing  # 1 event < min_events, although 100% failed
    g.observe(0, 1)
    g.observe(0, 1)
    g.observe(0, 1)
    assert not g.firing and g.ratio == 0.25  # 25% is not above 25%
    g.observe(1, 1)
    assert g.firing and g.ratio == pytest.approx(0.4)
    assert "2 of 5 replies (40%)" in g.reason() and "above 25%" in g.reason()


def test_alarm_is_logged_once_and_recovery_once(caplog):
    caplog.set_level(logging.INFO, logger="rlgate.guards")
    g = Guard(SPEC, window=8)
    for _ in range(8):
        g.observe(1, 1)
    assert g.firing and g.alarms == 1
    assert len(alarms(caplog)) == 1
    for _ in range(8):  # the window slides past every failure
        g.observe(0, 1)
    assert not g.firing
    recovered = [r for r in caplog.records if r.levelno == logging.INFO and "recovered" in r.getMessage()]
    assert len(recovered) == 1
    assert len(alarms(caplog)) == 1


def test_window_forgets_old_observations():
    g = Guard(SPEC, window=3)
    g.observe(5, 10)
    g.observe(0, 10)
    g.observe(0, 10)
    assert (g.failures, g.events) == (5, 30)
    g.observe(0, 10)
    assert (g.failures, g.events) == (0, 30)


def test_weighted_observations_and_zero_threshold():
    store = Guard(GuardSpec("store_write_failures", "store writes that failed", "writes", 0.0, 1), window=10)
    store.observe(0, 500)
    assert not store.firing
    store.observe(1, 3)
    assert store.firing  # any failure, however many writes went well
    store.observe(0, 0)  # a poll that saw nothing new changes nothing
    assert store.firing and store.events == 503


def test_set_reports_reasons_with_detail():
    gs = GuardSet([SPEC, GuardSpec("forks", "forks", "turns", 0.0, 1)], window=10,
                  details={"forks": lambda: "by reason: template_not_incremental 1"})
    gs.observe("forks", 1, 1)
    assert gs.degraded() == [{"guard": "forks", "reason": "forks: 1 of 1 turns (100%) in the last 1 observations, "
                              "above 0%; by reason: template_not_incremental 1"}]
    with pytest.raises(ValueError):
        Guard(SPEC, window=0)
