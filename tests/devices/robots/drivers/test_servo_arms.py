"""Servo-bus arms against the pty emulators, with the vendors' SDKs as the clients: wire
framing, calibration, motion under the agent, and every fault the issue names. Every test
that moves the arm judges every goal that went out on the wire."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers import dynamixel, feetech
from devices.robots.agent.drivers.arm_calibration import ArmCalibration, JointCalibration
from devices.robots.agent.drivers.dynamixel import READ_WAIT_S
from devices.robots.agent.emulators.dynamixel_bus import DynamixelBus, crc16, instruction_packet
from devices.robots.agent.emulators.feetech_bus import FeetechBus, packet
from devices.robots.agent.emulators.judge import unsafe_goals

RATE = 100.0
VENDORS: dict[str, tuple[Any, Any]] = {
    "dynamixel": (DynamixelBus, dynamixel.make_driver),
    "feetech": (FeetechBus, feetech.make_driver),
}


@pytest.fixture(autouse=True)
def _fast_gil() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)


def calibration(bus: str) -> ArmCalibration:
    """Mixed offsets and directions, so a sign or offset slip shows."""
    joints = tuple(
        JointCalibration(name, i + 1, 2048.0 + 200 * (i - 2), 1 if i % 2 == 0 else -1, -1.2, 1.0)
        for i, name in enumerate(["pan", "lift", "elbow", "wrist_flex", "wrist_roll", "gripper"])
    )
    return ArmCalibration("test_arm", bus, joints)


def start_ticks(cal: ArmCalibration, q: list[float]) -> list[float]:
    return [float(t) for t in cal.to_ticks(np.array(q))]


def drive(agent: Agent, target: np.ndarray, seconds: float, until: Any = None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        agent.heartbeat()
        try:
            agent.command("position", target)
        except DeviceError:
            return
        if until is not None and until():
            return
        time.sleep(0.02)


def test_wire_framing_matches_the_protocols() -> None:
    # Protocol 2.0 ping of id 1 as printed in the ROBOTIS e-manual: ... 01 19 4E
    assert instruction_packet(1, 0x01) == bytes.fromhex("FFFFFD0001030001194E")
    assert crc16(bytes.fromhex("FFFFFD00010300 01".replace(" ", ""))) == 0x4E19
    # SCS ping of id 1: checksum ~(1 + 2 + 1) = 0xFB
    assert packet(1, 0x01) == bytes.fromhex("FFFF010201FB")


@pytest.mark.parametrize("vendor", VENDORS)
def test_sdk_reads_registers_and_sync_reads(vendor: str) -> None:
    Bus, _ = VENDORS[vendor]
    with Bus([1, 7], positions=[1000, 3000]) as bus:
        if vendor == "dynamixel":
            import dynamixel_sdk as sdk

            ph, pk = sdk.PortHandler(bus.port), sdk.PacketHandler(2.0)
            assert ph.openPort()
            ph.ser.timeout = READ_WAIT_S  # as the drivers do: no busy loop starving the emulator
            assert pk.ping(ph, 7)[0] == 1020  # XM430-W350
            group, addr, n = sdk.GroupSyncRead(ph, pk, 132, 4), 132, 4
        else:
            import scservo_sdk as sdk

            ph, pk = sdk.PortHandler(bus.port), sdk.PacketHandler(0)
            assert ph.openPort()
            ph.ser.timeout = READ_WAIT_S
            assert pk.read2ByteTxRx(ph, 7, 3)[0] == 777  # STS3215
            group, addr, n = sdk.GroupSyncRead(ph, pk, 56, 2), 56, 2
        for i in (1, 7):
            group.addParam(i)
        assert group.txRxPacket() == 0
        assert [group.getData(i, addr, n) for i in (1, 7)] == [1000, 3000]
        assert pk.ping(ph, 9)[1] != 0  # nobody there: the SDK times out
        ph.closePort()


@pytest.mark.parametrize("vendor", VENDORS)
def test_arm_moves_to_target_with_calibration_and_safe_wire(vendor: str) -> None:
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    q0 = [0.0, 0.1, -0.2, 0.3, 0.0, 0.0]
    with Bus(cal.ids, positions=start_ticks(cal, q0)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        agent = Agent(drv)
        agent.start()
        try:
            s0 = drv.read_state()
            np.testing.assert_allclose(s0.joint_pos, q0, atol=2e-3)
            # a target beyond the calibrated range of joint 1: the envelope clamps it
            target = np.array([0.4, -0.3, 0.2, 1.5, -0.4, 0.2])
            drive(agent, target, 3.0)
            q = drv.read_state().joint_pos
            expect = np.clip(target, -1.2 + 0.005, 1.0 - 0.005)
            np.testing.assert_allclose(q, expect, atol=0.01)
            # raw servo ticks agree with offset and direction
            j = cal.joints[3]
            ticks = bus.servo(j.id).position
            assert ticks == pytest.approx(j.offset - 0.995 * 4096 / (2 * math.pi), abs=3)
            # the servo's own limits were written from the calibrated range
            info = drv.info()
            assert info.meta["bundle"]["calibration"]["joints"][3]["name"] == "wrist_flex"
            assert "<robot" in info.meta["bundle"]["urdf"]
        finally:
            agent.close()
        time.sleep(0.05)
        assert not any(s.torque_on for s in bus.servos.values())  # torque off on close
        assert len(bus.goals) > 100
        assert (
            unsafe_goals(
                bus.goals,
                cal,
                RATE,
                dict(zip(cal.ids, map(int, start_ticks(cal, q0)), strict=True)),
            )
            == []
        )


@pytest.mark.parametrize("vendor", VENDORS)
def test_joint_outside_calibrated_range_at_start_is_refused(vendor: str) -> None:
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    q0 = [0.0, 0.0, 1.4, 0.0, 0.0, 0.0]  # elbow past its max of 1.0 rad
    with Bus(cal.ids, positions=start_ticks(cal, q0)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        with pytest.raises(DeviceError, match=r"joint 'elbow' \(servo id 3\).*outside"):
            drv.start()
        time.sleep(0.05)
        assert bus.goals == []
        assert not any(s.torque_on for s in bus.servos.values())


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("fault", ["silent_servo", "bus_timeout", "corrupt_stream"])
def test_fault_mid_motion_stops_and_names_the_device(vendor: str, fault: str) -> None:
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    q0 = [0.0] * 6
    with Bus(cal.ids, positions=start_ticks(cal, q0)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        agent = Agent(drv)
        agent.start()
        try:
            target = np.array([0.8, -0.8, 0.8, -0.8, 0.8, 0.8])
            drive(agent, target, 0.4)
            assert agent.mode == "command", agent.stop_reason
            n_before = len(bus.goals)
            if fault == "silent_servo":
                bus.silence([4])
                expect = r"joint 'wrist_flex' \(servo id 4\) stopped answering"
            elif fault == "bus_timeout":
                bus.silence()
                expect = r"no servo answers \(bus timeout"
            else:
                bus.corrupt_replies(10_000)
                expect = r"corrupt status packets from joint 'pan' \(servo id 1\)"
            drive(agent, target, 2.0, until=lambda: agent.stop_reason is not None)
            t_seen = time.monotonic()
            assert agent.stop_reason is not None
            assert agent.mode in ("stopped", "idle")
            assert re.search(expect, agent.stop_reason), agent.stop_reason
            # the driver held the arm before it raised: nothing reached the bus since
            time.sleep(0.2)
            assert [g for g in bus.goals[n_before:] if g[0] > t_seen] == []
            for i in cal.ids:  # and every servo holds where it was last measured
                last = [raw for _, sid, raw in bus.goals if sid == i][-1]
                assert abs(bus.servo(i).position - last) <= 1.5
            # the stop is reported on (the last good state streams on), and a new command is
            # refused at the next tick without anything reaching the bus
            assert drv.read_state().seq == drv.read_state().seq
            n_now = len(bus.goals)
            agent.heartbeat()
            agent.command("position", target)
            time.sleep(0.1)
            assert agent.mode == "stopped" and "agent error" in (agent.stop_reason or "")
            assert len(bus.goals) == n_now
        finally:
            agent.close()
        assert unsafe_goals(bus.goals, cal, RATE, {i: 2048 + 200 * (i - 3) for i in cal.ids}) == []


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_few_corrupted_packets_are_retried_not_fatal(vendor: str) -> None:
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    with Bus(cal.ids, positions=start_ticks(cal, [0.0] * 6)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        drv.start()
        try:
            bus.corrupt_replies(2)  # two bad status packets, then clean again
            bus.noise(b"\x00\xff\x13\x37")
            s = drv.read_state()
            np.testing.assert_allclose(s.joint_pos, 0.0, atol=2e-3)
            assert drv.bus_retries == 1 and drv.fault is None
        finally:
            drv.close()


def test_dynamixel_bus_watchdog_stops_servos_when_the_agent_goes_quiet() -> None:
    cal = calibration("dynamixel")
    # a slow joint (0.48 rad/s: the driver sets that profile velocity), so the stop shows mid-way
    cal = replace(cal, joints=(replace(cal.joints[0], velocity=0.48), *cal.joints[1:]))
    with DynamixelBus(cal.ids, positions=start_ticks(cal, [0.0] * 6)) as bus:
        drv = dynamixel.make_driver(bus.port, cal, rate_hz=RATE)
        drv.start()
        try:
            assert drv.servo_watchdog
            s = bus.servo(1)
            drv.write_command("position", np.full(6, 0.9))
            time.sleep(0.35)  # nobody talks: the servos stop by themselves after 0.2 s
            with bus.lock:
                assert s.table[98] == 0xFF
                p1 = s.position
            time.sleep(0.15)
            q1 = float(cal.to_rad(np.array([p1] * 6))[0])
            assert 0.05 < q1 < 0.2  # stopped at about 0.2 s x 0.48 rad/s
            assert s.position == pytest.approx(p1, abs=0.5)  # and stays stopped
        finally:
            drv.close()


def test_calibration_file_errors_name_file_and_joint(tmp_path: Path) -> None:
    good = calibration("feetech").to_dict()
    bad = json.loads(json.dumps(good))
    bad["joints"][2]["direction"] = 2
    f = tmp_path / "arm.json"
    f.write_text(json.dumps(bad))
    with pytest.raises(DeviceError, match=r"arm\.json, joint 2 \(elbow\): direction"):
        ArmCalibration.load(f)
    bad["joints"][2]["direction"] = 1
    bad["joints"][2]["max"] = 4.0  # maps past tick 4095
    f.write_text(json.dumps(bad))
    with pytest.raises(DeviceError, match=r"joint elbow: range .* outside the servo's 0\.\.4095"):
        ArmCalibration.load(f)
    f.write_text(json.dumps(good))
    cal = ArmCalibration.load(f)
    q = np.array([0.3, -0.2, 0.1, 0.0, 0.5, -1.0])
    np.testing.assert_allclose(
        cal.to_rad(cal.to_ticks(q).astype(float)), q, atol=2 * math.pi / 4096
    )


@pytest.mark.parametrize("vendor", VENDORS)
def test_servo_limits_written_from_calibration_and_enforced_by_the_servo(vendor: str) -> None:
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    with Bus(cal.ids, positions=start_ticks(cal, [0.0] * 6)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        drv.start()
        try:
            j = cal.joints[1]  # direction -1: the tick range is reversed
            lo, hi = cal.tick_range(j)
            s = bus.servo(j.id)
            if vendor == "dynamixel":
                assert (s.i32(52), s.i32(48)) == (lo, hi)
            else:
                assert (s.u16(9), s.u16(11)) == (lo, hi)
            # a goal past the servo's own limit, sent around the driver, does not move it
            # past the limit (Dynamixel refuses it, the STS clamps it)
            with bus.lock:
                s.write(
                    116 if vendor == "dynamixel" else 42,
                    (hi + 300).to_bytes(4 if vendor == "dynamixel" else 2, "little"),
                    [],
                )
            time.sleep(0.4)
            assert s.position <= hi + 0.5
        finally:
            drv.close()


def test_bus_timing_follows_the_baud_rate() -> None:
    import dynamixel_sdk as sdk

    baud = 57600
    with DynamixelBus(range(1, 7), baud=baud) as bus:
        ph, pk = sdk.PortHandler(bus.port), sdk.PacketHandler(2.0)
        ph.baudrate = baud
        assert ph.openPort()
        ph.ser.timeout = READ_WAIT_S
        group = sdk.GroupSyncRead(ph, pk, 126, 10)
        for i in range(1, 7):
            group.addParam(i)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            assert group.txRxPacket() == 0
            times.append(time.perf_counter() - t0)
        wire_s = (20 + 6 * (11 + 10)) * 10 / baud  # instruction + six status packets
        assert min(times) >= wire_s  # 25 ms at 57600 baud (1.5 ms at 1 Mbps)
        ph.closePort()


# -- speed: what the servos actually do stays within the joints' velocity limits -------------


def true_speed_ratio(bus: Any, cal: ArmCalibration) -> float:
    """The fastest any emulated servo moved (its own physics, not what was read back) over
    its joint's velocity limit."""
    k = 2 * math.pi / cal.ticks_per_rev
    with bus.lock:
        return max(bus.servo(j.id).peak_speed * k / j.velocity for j in cal.joints)


@pytest.mark.parametrize("vendor", VENDORS)
def test_servo_moves_no_faster_than_the_joint_limit_after_a_late_far_goal(vendor: str) -> None:
    # A goal 0.25 rad ahead: as far as the envelope may lead the measured joint (velocity x
    # (one period + lead_s 0.08 s), what the judge lets through) — what a late write after a
    # stalled tick puts on the wire. Left at their top speed the servos followed it at 1.74x
    # (Feetech, 3400 steps/s) and 2.6x (Dynamixel) a 3 rad/s limit.
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    with Bus(cal.ids, positions=start_ticks(cal, [0.0] * 6)) as bus:
        drv = make(bus.port, cal, rate_hz=RATE)
        drv.start()
        try:
            goal = np.array([0.25, -0.25, 0.25, -0.25, 0.25, -0.25])
            drv.write_command("position", goal)
            time.sleep(0.25)
            q = drv.read_state().joint_pos
            np.testing.assert_allclose(q, goal, atol=0.01)  # it still gets there
            assert (
                unsafe_goals(bus.goals, cal, RATE, {i: 2048 + 200 * (i - 3) for i in cal.ids}) == []
            )
        finally:
            drv.close()
        assert 0.9 <= true_speed_ratio(bus, cal) <= 1.0
        # the servos' own limit: just under the joints' (rounded down to the register's unit)
        cap = getattr(drv, "speed_cap", None)
        assert cap is not None
        np.testing.assert_allclose(cap, 0.97 * 3.0, rtol=0.01)
        assert np.all(cap <= 0.97 * 3.0)


@pytest.mark.parametrize("vendor", VENDORS)
def test_bunched_control_ticks_do_not_overspeed_the_servos(vendor: str) -> None:
    # The loaded-machine case of issue 23 (1.74x once at load 10), stepped by hand: the agent
    # drives every joint at the envelope's soft speed, stalls 45 ms, then catches up with 4
    # ticks back to back (timing.RateLoop) - 4 goal steps within ~2 ms. With the servos at
    # their top speed the true speed reached 1.1-1.2x; the agent's own readings showed it too.
    Bus, make = VENDORS[vendor]
    cal = calibration(vendor)
    with Bus(cal.ids, positions=start_ticks(cal, [-1.0] * 6)) as bus:
        agent = Agent(make(bus.port, cal, rate_hz=RATE))
        seen: list[float] = []
        vmax = np.array([j.velocity for j in cal.joints])
        agent.add_state_listener(
            lambda seq, s, sent, mode, st: seen.append(float(np.max(np.abs(s.joint_vel) / vmax)))
        )
        agent.start(thread=False)
        try:
            target = np.full(6, 0.95)

            def tick(pause: float) -> None:
                agent.heartbeat()
                agent.command("position", target)
                agent.tick()
                time.sleep(pause)

            for _ in range(35):  # up to the soft speed (10 rad/s^2: 0.26 s)
                tick(1.0 / RATE)
            for _ in range(3):
                time.sleep(0.045)  # a stall ...
                for _ in range(4):
                    tick(0.0)  # ... and the catch-up
                for _ in range(5):
                    tick(1.0 / RATE)
            assert agent.mode == "command", agent.stop_reason
            assert max(seen) > 0.8  # it did run near the limit
        finally:
            agent.close()
        assert true_speed_ratio(bus, cal) <= 1.0
        assert max(seen) <= 1.0


def test_dynamixel_time_based_profile_is_switched_off_at_start() -> None:
    # With Drive Mode bit 2 set, Profile Velocity is a move's duration: a far goal is a fast
    # move whatever the joint's limit. The driver selects the velocity-based profile.
    cal = calibration("dynamixel")
    with DynamixelBus(cal.ids, positions=start_ticks(cal, [0.0] * 6)) as bus:
        for s in bus.servos.values():
            s.table[10] = 0x04 | 0x01  # time-based, reverse direction kept
        drv = dynamixel.make_driver(bus.port, cal, rate_hz=RATE)
        drv.start()
        try:
            assert all(s.table[10] == 0x01 for s in bus.servos.values())
            drv.write_command("position", np.full(6, 0.3))
            time.sleep(0.25)
        finally:
            drv.close()
        assert true_speed_ratio(bus, cal) <= 1.0


@pytest.mark.parametrize("dt", [1e-4, 2e-3, 0.01, 0.05])
def test_emulated_servo_speed_cap_holds_at_every_instant(dt: float) -> None:
    from devices.robots.agent.emulators.pty_bus import ServoModel

    s = ServoModel(sid=1, position=0.0, goal=0.0, torque_on=True, max_speed=1000.0)
    s.advance(1.0)
    s.goal = 500.0  # far: 0.5 s at the cap
    t, path = 1.0, []
    while t < 2.0:
        t += dt
        s.advance(t)
        path.append((t, s.position, s.velocity))
    assert s.peak_speed == pytest.approx(1000.0)
    assert max(v for _, _, v in path) <= 1000.0 + 1e-9
    # at the cap until |error| / tau falls to it (0.47 s), then the exponential approach
    t_mid = 1.0 + (500.0 - 1000.0 * s.tau_s) / 1000.0
    p_mid = np.interp(t_mid, [p[0] for p in path], [p[1] for p in path])
    assert p_mid == pytest.approx(500.0 - 1000.0 * s.tau_s, abs=1000.0 * dt + 1e-6)
    assert path[-1][1] == pytest.approx(500.0, abs=1e-3)
