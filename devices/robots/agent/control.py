"""The robot agent: the process next to a robot (or the virtual lab) that runs commands and
uploaded policies at the control rate, inside the safety envelope and under the watchdog.

Modes: idle (driver holds, nothing commanded) -> command (a client streams targets) or
policy (an uploaded ONNX policy runs here) -> stopped (held; a new command resumes, except
after a watchdog stop or a stop on the measured state: those latch, and only `acquire`
moves the robot again) or estop (latched: everything is refused until the operator — the
client that held the robot when it latched, or the robot's own console — resets it).
Exactly one client controls the robot at a time; the others may watch, stop and e-stop, but
a stop by a watcher never hands control over (ownership rules: wire/PROTOCOL.md). A policy runs
only for the client that uploaded it, named by its id. All driver writes happen on the
control thread, under the agent's lock, so a stop can never be overtaken by a late command.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.agent_log import AgentLog
from devices.robots.agent.drivers.interface import RobotDriver, fresh_state, stamp_command_time
from devices.robots.agent.object_poses import ObjectFeed, ObjectPoseError, ObjectReport
from devices.robots.agent.policy_runner import OnnxPolicy
from devices.robots.agent.policy_worker import (
    CHILD_NICE,
    CHILD_NICE_RT,
    InferenceWorker,
    OnnxProcessWorker,
    PolicyFn,
    PolicyWorker,
)
from devices.robots.agent.safety import SafetyEnvelope
from devices.robots.agent.safety_config import SafetyConfig, default_config
from devices.robots.agent.timing import RateLoop, set_realtime
from devices.robots.agent.watchdog import Watchdog, WatchdogConfig
from devices.robots.wire.policy_spec import PolicySpec
from devices.robots.wire.robot_types import RobotState

Vec = NDArray[np.float64]
StateListener = Callable[[int, RobotState, "Vec | None", str, dict[str, Any]], None]
EventListener = Callable[[str, str, dict[str, Any]], None]
LOCAL = "local"
PROBE_TIMEOUT_S = 0.5  # the upload check's first inference (onnxruntime warms up in it)


class Agent:
    """Wraps any RobotDriver. `start()` runs the control loop on its own thread."""

    def __init__(
        self,
        driver: RobotDriver,
        safety: SafetyConfig | None = None,
        watchdog: WatchdogConfig | None = None,
        log_seconds: float = 60.0,
        realtime_priority: int | None = None,
    ) -> None:
        self.driver = driver
        self.info = driver.info()
        self.n = len(self.info.joint_names)
        self.dt = 1.0 / self.info.control_rate_hz
        self.base_safety = safety or default_config(self.info)
        # the whole arm where the driver can say where its links are, else the tool point
        points = getattr(driver, "collision_points", None) or driver.forward_kinematics
        self.envelope = SafetyEnvelope(self.info, self.base_safety, fk=points)
        self.watchdog = Watchdog(watchdog or WatchdogConfig(), self.dt)
        self.log = AgentLog(self.n, max(16, int(log_seconds * self.info.control_rate_hz)))
        self.loop = RateLoop(self.info.control_rate_hz, resync_periods=0.5)  # no catch-up bursts
        self.realtime_priority = realtime_priority  # SCHED_FIFO for the loop thread, if allowed
        self.realtime = False
        self.mode = "idle"
        self.stop_reason: str | None = None
        self.owner: str | None = None
        self.operator: str | None = None  # who may reset the latched e-stop (None: anyone)
        self.last_owner: str | None = None  # the previous controller, while still connected
        self.watchdog_latched: str | None = None  # why motion waits for a new `acquire`
        self.watchdog_stops: list[dict[str, float]] = []  # deadline, stopped_at, latency_s
        self._lock = threading.RLock()
        self._cmd_mode = "position"
        self._target: Vec | None = None
        self._prev: Vec = np.zeros(self.n)
        self._policy: OnnxPolicy | None = None
        self._policy_fn: PolicyFn | None = None
        self._policy_mode = "position"
        self._policy_safety = self.base_safety  # envelope while the policy runs (tighter)
        self._policy_owner: str | None = None  # who uploaded the loaded policy
        self.policy_id: str | None = None  # its id (hash of model, spec and safety config)
        self._worker: InferenceWorker | None = None
        self._ramp = (0.0, 0.0)  # start time, duration (s)
        self._policy_last_output = 0.0
        self._ramp_from: Vec = np.zeros(self.n)
        self._seq = 0
        self._due = 0.0
        self._last_tick = float("inf")  # monotonic time of the previous tick
        self.stall_s = max(5.0 * self.dt, 0.02)  # a longer gap between ticks: the agent stalled
        self._last_driver_seq = -1
        self._acted: tuple[str, ...] = ()
        # poses streamed by the workbench's camera tracker, stamped at most one tick ahead
        self.objects = ObjectFeed(future_tolerance_s=self.dt)
        self.object_stops: list[dict[str, float]] = []  # deadline_t, stopped_t (robot clock)
        self._robot_t = float("nan")  # newest measured state's time (the robot's clock)
        self._policy_t0 = 0.0  # robot time the policy started
        self._state_listeners: list[StateListener] = []
        self._event_listeners: list[EventListener] = []
        self._running = False
        self._thread: threading.Thread | None = None
        self.tick_work_s = np.zeros(4096)

    # -- lifecycle --------------------------------------------------------------------
    def start(self, thread: bool = True) -> None:
        """Start the driver and (unless thread=False, for stepping by hand) the loop."""
        self.driver.start()
        if thread:
            self._running = True
            self._thread = threading.Thread(target=self._run, name="twinbench-agent", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the loop, leave the robot held, release the driver."""
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            self._halt("agent closed", "stopped")
        if self._worker is not None:
            self._worker.close()
        self.driver.close()

    def _run(self) -> None:
        if self.realtime_priority:
            self.realtime = set_realtime(self.realtime_priority)
        self.loop.restart()
        while self._running:
            self._due = self.loop.wait()
            try:
                self.tick()
            except Exception as exc:  # a driver fault: stop and keep the loop alive
                with self._lock:
                    self._halt(f"agent error: {exc}", "stopped")
                time.sleep(self.dt)

    # -- listeners --------------------------------------------------------------------
    def add_state_listener(self, fn: StateListener) -> None:
        self._state_listeners = [*self._state_listeners, fn]

    def remove_state_listener(self, fn: StateListener) -> None:
        self._state_listeners = [f for f in self._state_listeners if f is not fn]

    def add_event_listener(self, fn: EventListener) -> None:
        self._event_listeners = [*self._event_listeners, fn]

    def remove_event_listener(self, fn: EventListener) -> None:
        self._event_listeners = [f for f in self._event_listeners if f is not fn]

    def _event(self, kind: str, message: str, **data: Any) -> None:
        for fn in self._event_listeners:
            fn(kind, message, data)

    # -- control API (any thread) -------------------------------------------------------
    def _claim(self, owner: str) -> None:
        if self.mode == "estop":
            raise DeviceError(
                f"{self.info.name}: e-stop is latched ({self.stop_reason}); reset it first"
            )
        if self.owner not in (None, owner):
            raise DeviceError(f"{self.info.name} is controlled by another client ({self.owner})")
        if self.watchdog_latched is not None:
            raise DeviceError(
                f"{self.info.name}: stopped ({self.watchdog_latched}); "
                "take control again (acquire) before moving it"
            )
        self._set_owner(owner)

    def _set_owner(self, owner: str) -> None:
        self.owner = self.last_owner = owner

    def acquire(self, owner: str = LOCAL) -> None:
        """Take control explicitly: the only way to move again after a watchdog stop."""
        with self._lock:
            if self.mode == "estop":
                raise DeviceError(
                    f"{self.info.name}: e-stop is latched ({self.stop_reason}); reset it first"
                )
            if self.owner not in (None, owner):
                raise DeviceError(
                    f"{self.info.name} is controlled by another client ({self.owner})"
                )
            self._set_owner(owner)
            self.watchdog_latched = None
            self.watchdog.heartbeat(time.monotonic())

    def _activate(self, now: float, state: RobotState) -> None:
        if self.mode not in ("command", "policy"):
            self.envelope.start(state)
            self._prev = (
                state.joint_pos.copy() if self._cmd_mode == "position" else np.zeros(self.n)
            )
            self.watchdog.arm(now)

    def heartbeat(self, owner: str = LOCAL) -> None:
        if owner == self.owner or self.owner is None:
            self.watchdog.heartbeat(time.monotonic())

    def command(self, mode: str, values: Vec, owner: str = LOCAL) -> None:
        """Stream a joint target (position, rad) or velocity (rad/s); torque where supported."""
        if mode not in self.info.command_modes and not (mode == "position"):
            raise DeviceError(
                f"{self.info.name} does not accept '{mode}' commands "
                f"(modes: {', '.join(self.info.command_modes)})"
            )
        with self._lock:
            if self.mode == "policy":
                raise DeviceError(f"{self.info.name}: a policy is running; stop it first")
            self._claim(owner)
            now = time.monotonic()
            if self.mode != "command" or mode != self._cmd_mode:
                self._cmd_mode, self.mode = mode, "idle"
                self.envelope.configure(self.base_safety)
                self._activate(now, self.driver.read_state())
            self._target = np.array(values, dtype=float)
            self.mode, self.stop_reason = "command", None
            self.watchdog.command(now)

    def load_policy(self, fn: PolicyFn, mode: str = "position", owner: str = LOCAL) -> None:
        """Install a Python policy `fn(state) -> command` (tests and fuzzing; the protocol
        uploads ONNX through `upload_policy`). Trusted local code: it runs on a thread."""
        with self._lock:
            self._check_upload(owner)
            self._install(PolicyWorker(fn), fn, mode, None, self.base_safety, owner, "local")

    def _check_upload(self, owner: str) -> None:
        """Uploading claims control (as a first command does): refused while another
        client holds the robot, while a policy runs, or while the e-stop is latched."""
        if self.mode == "policy":
            raise DeviceError(f"{self.info.name}: stop the running policy before replacing it")
        if self.mode == "estop":
            raise DeviceError(
                f"{self.info.name}: e-stop is latched ({self.stop_reason}); reset it first"
            )
        if self.owner not in (None, owner):
            raise DeviceError(
                f"{self.info.name} is controlled by another client ({self.owner}); only the "
                "client in control may upload a policy"
            )

    def _install(
        self,
        worker: InferenceWorker,
        fn: PolicyFn | None,
        mode: str,
        policy: OnnxPolicy | None,
        safety: SafetyConfig,
        owner: str,
        pid: str,
    ) -> None:
        """Replace the loaded policy (under the lock; the old worker is shut down)."""
        old = self._worker
        self._worker, self._policy_fn, self._policy_mode, self._policy = worker, fn, mode, policy
        self._policy_safety, self._policy_owner, self.policy_id = safety, owner, pid
        if self.owner is None:
            self._set_owner(owner)
        if old is not None:
            old.close()

    def upload_policy(
        self,
        onnx_bytes: bytes,
        spec: dict[str, Any],
        safety: dict[str, Any] | None = None,
        owner: str = LOCAL,
    ) -> dict[str, Any]:
        """Load an ONNX policy with its spec and (optionally tighter) safety config for the
        client `owner` (who must be in control, or nobody); runs it once on the current
        state to check its output. Returns a summary with the policy's id, which
        `run_policy` must name."""
        with self._lock:
            self._check_upload(owner)
        pspec = PolicySpec.from_dict(spec, robot_joints=self.info.joint_names)
        cfg = self.base_safety
        if safety:
            cfg = self.base_safety.tightened(SafetyConfig.from_dict(safety, "policy safety config"))
        pid = _policy_id(onnx_bytes, spec, cfg)
        # its own process loads the model and checks it against the spec (DeviceError)
        nice = CHILD_NICE_RT if self.realtime else CHILD_NICE  # below the loop, never starved
        worker = OnnxProcessWorker(onnx_bytes, pspec, self.info, ObjectFeed(), nice=nice)
        try:
            state = self.driver.read_state()
            t0 = time.perf_counter()
            worker.probe(state, PROBE_TIMEOUT_S)  # DeviceError: failed / too slow
            infer_ms = (time.perf_counter() - t0) * 1e3
            with self._lock:
                self._check_upload(owner)  # again: control may have changed meanwhile
                worker.policy.feed = self.objects
                self.objects.expect(
                    [pspec.object] if pspec.object else [], pspec.object_min_quality
                )
                self._install(worker, None, pspec.action_mode, worker.policy, cfg, owner, pid)
        except BaseException:
            worker.close()  # does not wait
            raise
        return {
            "policy": pid,
            "observation": list(pspec.observation),
            "action_mode": pspec.action_mode,
            "inference_ms": infer_ms,
            "safety": cfg.to_dict(),
            "object": pspec.object,
            "object_max_age_s": pspec.object_max_age_s,
        }

    def object_pose(
        self, name: Any, pose: Any, t: Any, quality: Any, lost: Any, owner: str = LOCAL
    ) -> ObjectReport:
        """Keep a tracked object pose streamed by the workbench (capture time `t` on the
        robot's clock). ObjectPoseError naming what is wrong with a report (object_poses.py)."""
        with self._lock:
            if self.owner != owner:  # a watcher must not feed (or block) the policy's view
                raise ObjectPoseError(
                    "refused",
                    f"{self.info.name} is controlled by another client ({self.owner}); only "
                    "it may stream object poses"
                    if self.owner is not None
                    else f"{self.info.name}: take control (acquire) before streaming object poses",
                )
            now = self._robot_t
            if not np.isfinite(now):
                now = self.driver.read_state().t
        return self.objects.update(name, pose, t, quality, lost, now)

    def _object_stale(self, now_t: float) -> str | None:
        """Why the running policy must stop for its object's tracking, or None."""
        pol = self._policy
        if pol is None or "object_pose" not in pol.spec.observation:
            return None
        return self.objects.stale(
            str(pol.spec.object), now_t, pol.spec.object_max_age_s, self._policy_t0
        )

    def run_policy(
        self, ramp_s: float = 1.0, owner: str = LOCAL, policy: str | None = None
    ) -> None:
        """Start the loaded policy, blending in from the current pose over `ramp_s` seconds.
        Only its uploader may run it; `policy` (its id from `upload_policy`) guards against
        running a model that replaced the one the caller meant."""
        worker = self._worker
        if worker is not None and not worker.ready:
            worker.wait_ready(1.0)  # restarting after a kill (~0.3 s); never under the lock
        with self._lock:
            worker = self._worker
            if worker is None:
                raise DeviceError(f"{self.info.name}: no policy uploaded")
            if self._policy_owner != owner:
                raise DeviceError(
                    f"{self.info.name}: the loaded policy was uploaded by another client "
                    f"({self._policy_owner}); upload yours (policy_upload) and run that"
                )
            if policy is not None and policy != self.policy_id:
                raise DeviceError(
                    f"{self.info.name}: policy {policy!r} is not the loaded one "
                    f"({self.policy_id}); upload it again"
                )
            self._claim(owner)
            now = time.monotonic()
            state = self.driver.read_state()
            self._policy_t0 = state.t
            stale = self._object_stale(state.t)
            if stale is None and self._policy is not None and self._policy.spec.object:
                if "object_pose" in self._policy.spec.observation and (
                    self.objects.good(self._policy.spec.object) is None
                ):
                    stale = f"object tracking: no pose of '{self._policy.spec.object}' yet"
            if stale is not None:
                raise DeviceError(
                    f"{self.info.name}: policy not started, {stale}; stream the object's "
                    "tracked pose (object_pose) first"
                )
            worker.discard()  # an output computed from an older state must not be used
            if not worker.ready:
                raise DeviceError(
                    f"{self.info.name}: the policy's process is restarting (its last "
                    "inference was killed); try again in a moment"
                )
            self._cmd_mode = self._policy_mode
            self.mode = "idle"
            self.envelope.configure(self._policy_safety)
            self._activate(now, state)
            self._ramp, self._ramp_from = (now, max(0.0, ramp_s)), state.joint_pos.copy()
            self._policy_last_output = now
            self.mode, self.stop_reason = "policy", None
            self._event("policy", "policy started", ramp_s=ramp_s)

    def stop(self, reason: str = "stop requested", owner: str | None = None) -> None:
        """Hold the robot (not latching). Any client may stop it; the controller's own stop
        also hands control back, anyone else's keeps the controller in control (a watcher
        cannot take over with stop + command)."""
        with self._lock:
            if self.mode != "estop":
                keep = owner is not None and self.owner not in (None, owner)
                self._halt(reason, "stopped", keep_owner=keep)

    def estop(self, reason: str = "e-stop requested", owner: str = LOCAL) -> None:
        """Latching stop: refuses everything until `reset` by the operator. Any client may
        press it; the operator is whoever controlled the robot then, or, if nobody did, the
        client that controlled it last while it is still connected; with neither, any
        client may reset (a bystander's press never locks the operator out)."""
        with self._lock:
            if self.mode != "estop":
                self.operator = self.owner or self.last_owner
            self._halt(reason, "estop", keep_owner=True)

    def reset(self, owner: str = LOCAL) -> None:
        """Clear a latched e-stop; only the operator or the robot's console (LOCAL) may.
        If the operator has disconnected, any client may."""
        with self._lock:
            if self.mode != "estop":
                return
            if owner != LOCAL and self.operator not in (None, owner):
                raise DeviceError(
                    f"{self.info.name}: only the operator ({self.operator}) or the robot's "
                    "console may reset this e-stop"
                )
            self.mode, self.stop_reason, self.operator = "idle", None, None
            if self.owner is not None and self.owner != owner and owner != LOCAL:
                self.owner = None  # the operator had left; whoever reset it may take control
            self._event("reset", "e-stop reset", by=owner)

    def release(self, owner: str, reason: str) -> None:
        """The client `owner` went away: stop if it was in control."""
        with self._lock:
            if self.owner == owner:
                if self.mode in ("command", "policy"):
                    self._halt(reason, "stopped")
                self.owner = None
            if self.last_owner == owner:
                self.last_owner = None
            if self.operator == owner:
                self.operator = None  # the e-stop's operator left: anyone may reset it
            if self._policy_owner == owner and self.mode != "policy":
                self._forget_policy()  # nobody else may run it

    def _forget_policy(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self._worker = self._policy_fn = self._policy = None
        self._policy_owner = self.policy_id = None

    def _halt(self, reason: str, mode: str, keep_owner: bool = False) -> None:
        was = self.mode
        self.driver.hold()
        self.watchdog.disarm()
        self.mode, self.stop_reason, self._target = mode, reason, None
        if not keep_owner:
            self.owner = None
        if mode == "estop" or was in ("command", "policy"):
            self._event(mode if mode == "estop" else "stop", reason)

    # -- the control tick (control thread) ------------------------------------------------
    def tick(self) -> None:
        """One control period: read, check deadlines, decide, apply the envelope, write."""
        t_start = time.perf_counter()
        state = self._fresh_state()
        with self._lock:
            self._robot_t = state.t
            now = time.monotonic()
            raw: Vec | None = None
            sent: Vec | None = None
            acted: tuple[str, ...] = ()
            mode = self.mode
            if now - self._last_tick > self.stall_s and mode in ("command", "policy"):
                self._stalled(self._last_tick, now)
            self._last_tick = now
            if mode in ("command", "policy"):
                late = self.watchdog.check(now, mode == "command" and self._cmd_mode != "position")
                if late is not None:
                    self._halt(late[0], "stopped")
                    self.watchdog_latched = late[0]
                    stopped_at = time.monotonic()
                    self.watchdog_stops.append(
                        {
                            "deadline": late[1],
                            "stopped_at": stopped_at,
                            "latency_s": stopped_at - late[1],
                        }
                    )
                    self._event(
                        "watchdog",
                        late[0],
                        latency_s=stopped_at - late[1],
                        detect_s=now - late[1],
                        tick_late_s=t_start - self._due,
                    )
                elif mode == "command":
                    raw = self._target
                elif (stale := self._object_stale(state.t)) is not None:
                    self._stop_for_tracking(stale, state.t)
                else:
                    raw = self._policy_step(state, now)
                if raw is not None and self.mode in ("command", "policy"):
                    cand = raw if mode == "command" else self._ramped(raw, state, now)
                    res = self.envelope.apply(self._cmd_mode, cand, state, self._prev)
                    acted = res.acted
                    if res.stop is not None:
                        self._halt(f"safety: {res.stop}", "stopped", keep_owner=res.measured)
                        if res.measured:  # latches: no resuming from a pose past the limits
                            self.watchdog_latched = f"safety: {res.stop}"
                        self._event("safety", res.stop, acted=list(acted))
                    else:
                        self.driver.write_command(self._cmd_mode, res.command)  # type: ignore[arg-type]
                        self._prev = sent = res.command
                        state = stamp_command_time(self.driver, state)  # when it arrived
                        if acted and acted != self._acted:
                            self._event(
                                "safety", f"clamped by {', '.join(acted)} limit", acted=list(acted)
                            )
            self._acted = acted
            self._seq += 1
            self.log.record(state.t, raw, sent, state.joint_pos, state.joint_vel, acted, self.mode)
            status = {
                "estop": self.mode == "estop",
                "acted": list(acted),
                "stop_reason": self.stop_reason,
            }
            mode_now, seq = self.mode, self._seq
        for fn in self._state_listeners:
            fn(seq, state, sent, mode_now, status)
        self.tick_work_s[seq % self.tick_work_s.size] = time.perf_counter() - t_start

    def _stalled(self, start: float, end: float) -> None:
        """The control loop itself did not run from `start` to `end` (SIGSTOP, a loaded
        computer): the watchdog gives the connection time to deliver what piled up."""
        if self.watchdog.agent_stalled(start, end) and end - start > 0.05:
            self._event(
                "stall",
                f"control loop stalled {(end - start) * 1e3:.0f} ms (the robot side was held "
                f"up); the heartbeat deadline waits {self.watchdog.drain_s * 1e3:.0f} ms "
                "for the messages sent meanwhile",
                stall_s=end - start,
            )

    def _stop_for_tracking(self, reason: str, now_t: float) -> None:
        """Stale or lost object tracking: a watchdog stop (sticks until `acquire`)."""
        self._halt(reason, "stopped")
        self.watchdog_latched = reason
        pol = self._policy
        assert pol is not None
        good = self.objects.good(str(pol.spec.object))
        seen = good.t if good is not None else self._policy_t0
        deadline = seen + pol.spec.object_max_age_s
        self.object_stops.append({"deadline_t": deadline, "stopped_t": now_t})
        self._event("watchdog", reason, object=pol.spec.object, late_s=now_t - deadline)

    def _fresh_state(self) -> RobotState:
        state = fresh_state(self.driver, self._last_driver_seq, 0.25 * self.dt)
        self._last_driver_seq = state.seq
        return state

    def _policy_step(self, state: RobotState, now: float) -> Vec | None:
        """The policy's command for this tick, or None when its output is not ready yet (the
        actuators keep the previous command). Stops when no fresh output has arrived for the
        watchdog's policy deadline, or when the policy raises."""
        worker = self._worker
        assert worker is not None
        if not worker.busy:
            worker.submit(state)
        try:
            out = worker.result(0.5 * self.dt)
        except Exception as exc:
            text = str(exc)
            self._halt(text if text.startswith("policy") else f"policy failed: {text}", "stopped")
            return None
        if out is None:
            age = now - self._policy_last_output
            if age > self.watchdog.policy_timeout_s:
                worker.kill()  # a hung model: SIGKILL now, a fresh process in the background
                reason = (
                    f"watchdog: policy output late ({age * 1e3:.1f} ms without a new "
                    f"output, limit {self.watchdog.policy_timeout_s * 1e3:.1f} ms)"
                )
                self._halt(reason, "stopped")
                self.watchdog_latched = reason
                self._event("watchdog", reason, latency_s=age - self.watchdog.policy_timeout_s)
            return None
        self._policy_last_output = now
        if self._policy is not None:
            return self._policy.to_command(out, state)
        return np.asarray(out, dtype=float)

    def _ramped(self, cmd: Vec, state: RobotState, now: float) -> Vec:
        t0, dur = self._ramp
        if dur <= 0 or now - t0 >= dur:
            return cmd
        a = (now - t0) / dur
        if self._cmd_mode == "position":
            return self._ramp_from + a * (cmd - self._ramp_from)
        return a * cmd

    # -- queries ------------------------------------------------------------------------
    def box_distances(self, poses: Vec) -> list[float] | None:
        """How far (m) each joint pose in `poses` (N, n) puts the end effector outside the
        envelope's workspace box, or a link below its floor (`SafetyEnvelope.box_distance`:
        0 inside); None when the envelope has no box or the driver no kinematics. What the
        workbench checks a planned motion against before streaming it: the robot's own box
        and its own kinematics. One pose at a time, so the control loop, which shares the
        driver's kinematics, waits for at most one."""
        env = self.envelope
        if env.box is None or env.fk is None:
            return None
        return [round(env.box_distance(q), 6) for q in np.asarray(poses, float)]

    def status(self, jitter_window_s: float | None = None) -> dict[str, Any]:
        """Mode, owner, stop reason, safety and watchdog config, loop jitter (ms) over the
        last `jitter_window_s` seconds (default: the whole history)."""
        last = int(jitter_window_s * self.info.control_rate_hz) if jitter_window_s else None
        return {
            "mode": self.mode,
            "estop": self.mode == "estop",
            "owner": self.owner,
            "operator": self.operator,
            "watchdog_latched": self.watchdog_latched,
            "stop_reason": self.stop_reason,
            "policy_loaded": self._worker is not None,
            "policy": self.policy_id,
            "policy_owner": self._policy_owner,
            "safety": self.envelope.config.to_dict(),
            "watchdog": self.watchdog.config.to_dict(),
            "realtime": self.realtime,
            "jitter_ms": self.loop.jitter_ms(last),
            "objects": {
                n: {"t": r.t, "quality": r.quality, "lost": r.lost, "received": r.received}
                for n in self.objects.objects
                if (r := self.objects.last(n)) is not None
            },
            "object_stops": list(self.object_stops[-20:]),
        }


def _policy_id(onnx_bytes: bytes, spec: dict[str, Any], safety: SafetyConfig) -> str:
    """A short id naming one upload: the hash of the model, its spec and its safety config."""
    h = hashlib.sha256(onnx_bytes)
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    h.update(json.dumps(safety.to_dict(), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
