"""The watchdog's heartbeat deadline when the agent itself stalls: heartbeats sent while the
robot side was held up lie unread in the socket, so the silence is not the workbench's. The
deadline waits `drain_s` after the stall for them, but only for a workbench that was heard
from within the deadline when the stall began, so a lost workbench is still stopped (at most
the stall plus `drain_s` late). Times are explicit: the arithmetic is checked exactly."""

from __future__ import annotations

import pytest

from devices.robots.agent.watchdog import Watchdog, WatchdogConfig

HB = 0.25  # heartbeat timeout (s)


def _armed(last_heartbeat: float) -> Watchdog:
    w = Watchdog(WatchdogConfig(heartbeat_timeout_s=HB, command_timeout_s=0.1), dt=0.004)
    w.arm(0.0)
    w.heartbeat(last_heartbeat)
    return w


def test_a_stall_of_the_agent_is_not_blamed_on_a_live_workbench() -> None:
    w = _armed(0.10)  # heard at 0.10 s; the agent stalls from 0.12 s to 0.52 s
    assert w.check(0.52, streamed_command=False) is not None  # without the grace: a stop
    assert w.agent_stalled(0.12, 0.52)
    assert w.drain_s == pytest.approx(HB / 2)
    assert w.check(0.52, streamed_command=False) is None
    assert w.check(0.52 + HB / 2 - 1e-3, streamed_command=False) is None
    w.heartbeat(0.53)  # the backlog is read: deadlines run from the newest heartbeat again
    assert w.check(0.53 + HB - 1e-3, streamed_command=False) is None
    assert w.check(0.53 + HB + 1e-3, streamed_command=False) is not None


def test_a_workbench_silent_through_the_stall_is_stopped_after_the_drain() -> None:
    w = _armed(0.10)
    assert w.agent_stalled(0.12, 0.52)
    late = w.check(0.52 + HB / 2 + 1e-3, streamed_command=False)  # nothing arrived after it
    assert late is not None and "no heartbeat from the workbench" in late[0]
    assert late[1] == pytest.approx(0.52 + HB / 2)  # stopped at most stall + drain late


def test_a_workbench_already_silent_when_the_stall_began_gets_no_grace() -> None:
    w = _armed(0.10)  # deadline 0.35 s; the stall begins at 0.40 s
    assert not w.agent_stalled(0.40, 0.80)
    late = w.check(0.80, streamed_command=False)
    assert late is not None and late[1] == pytest.approx(0.10 + HB)


def test_repeated_stalls_do_not_keep_a_lost_workbench_alive() -> None:
    """Stalls every 60 ms chain grace only while the last heartbeat was fresh at a stall's
    start: the stop comes by the last such stall's end plus the drain."""
    w = _armed(0.0)
    t, stopped = 0.0, None
    while t < 2.0 and stopped is None:
        w.agent_stalled(t, t + 0.03)  # 30 ms stall, then 30 ms of ticks
        for k in range(8):
            now = t + 0.03 + 0.004 * k
            if w.check(now, streamed_command=False) is not None:
                stopped = now
                break
        t += 0.06
    assert stopped is not None
    assert stopped <= 0.0 + HB + 0.03 + HB / 2 + 0.004


def test_streamed_commands_get_no_grace() -> None:
    w = _armed(0.10)
    w.command(0.10)
    assert w.agent_stalled(0.12, 0.52)
    late = w.check(0.52, streamed_command=True)
    assert late is not None and "streamed command" in late[0]


def test_a_disarmed_watchdog_gives_no_grace() -> None:
    w = _armed(0.10)
    w.disarm()
    assert not w.agent_stalled(0.12, 0.52)
    assert w.check(10.0, streamed_command=False) is None
