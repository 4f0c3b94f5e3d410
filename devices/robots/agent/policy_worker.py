"""Policy inference off the control loop's path: the loop submits a state, collects the
output on a later tick or gives up on it (the watchdog's policy deadline), and never waits
longer than the timeout it passes to `result`.

Two workers share that interface (`InferenceWorker`):

- `OnnxProcessWorker` runs an uploaded ONNX model in its own process, below the control
  loop's priority (SCHED_OTHER, set in the child whatever it inherited; nice 10 when the
  loop itself could not get SCHED_FIFO and shares the normal scheduler with it, nice 0 when
  it runs SCHED_FIFO, which no normal process can delay: at nice 10 a busy desktop starved
  the policy past its 20 ms deadline on 2 cores while the app ran beside it), one
  inference at a time, with a hard deadline: a hung or replaced model is SIGKILLed and a
  fresh process is started in the background. A thread could not give that: a model that
  never ends would hold a core (at the loop's real-time priority, measured: two busy FIFO
  workers held the 20 ms policy watchdog up by 5.3 s on 2 cores) and the GIL-free C++ run
  cannot be interrupted. The observation is still built here (`OnnxPolicy.observe`: the
  object feed lives in the agent's process); only raw arrays cross the socket.
- `PolicyWorker` runs an in-process Python callable (`Agent.load_policy`: tests, fuzzing) on
  a normal-priority thread. Python code cannot be killed: it is trusted local code, and
  `kill` only abandons a call that hangs (the worker is not `ready` until it returns).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.object_poses import ObjectFeed
from devices.robots.agent.policy_runner import (
    ModelIO,
    OnnxPolicy,
    load_session,
    obs_shape,
    output_values,
)
from devices.robots.wire.policy_spec import PolicySpec
from devices.robots.wire.robot_types import RobotInfo, RobotState

PolicyFn = Callable[[RobotState], NDArray[np.float64]]

CHILD_NICE = 10  # the policy process's nice (at least) beside a loop without SCHED_FIFO
CHILD_NICE_RT = 0  # ... beside a SCHED_FIFO loop, which it cannot delay anyway
LOAD_TIMEOUT_S = 10.0  # process start + model load, at construction and after a kill
MAX_INFERENCE_S = 1.0  # any inference still running after this is killed, caller or not
SUPERVISE_S = 0.1  # how often the supervisor looks at an idle child (death, deadlines)
PARENT_CHECK_S = 0.25  # how often the child checks that the agent is still there
RESPAWN_TRIES = 3  # failed restarts in a row before the worker gives up (not ready)
MAX_ERROR_CHARS = 600

# The model reaches the child in a memory file (its fd passed at start). On the socket
# (multiprocessing.connection framing) the agent sends raw float32 observations; the child
# sends one tag byte and a payload: L + ModelIO json (loaded) or F + text (load failed),
# then per observation R + n float64 values or E + the model's error text.
LOADED, LOAD_FAILED, RESULT, ERROR = b"L", b"F", b"R", b"E"

# The policy process is a fresh interpreter (fork+exec: safe in the agent's multithreaded
# process; multiprocessing's spawn and forkserver would also re-run the agent's main module
# in every child). It lowers its own priority before importing anything heavy.
_CHILD_CODE = """
import os, sys
try:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, 0, max(int(sys.argv[5]), os.getpriority(os.PRIO_PROCESS, 0)))
except Exception:
    pass
from devices.robots.agent.policy_worker import child_main
child_main()
"""
_REPO_ROOT = str(Path(__file__).resolve().parents[3])


def _child_env() -> dict[str, str]:
    """The agent's environment, with this checkout importable whatever the working folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def normal_priority_thread() -> None:
    """Put the calling thread on SCHED_OTHER: a thread inherits the scheduling policy of the
    thread that created it, and processes started from it inherit it again. Lowering is
    always allowed."""
    with contextlib.suppress(OSError, AttributeError):
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


class InferenceWorker(Protocol):
    """What the control loop uses of a policy worker."""

    @property
    def busy(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    def submit(self, state: RobotState) -> bool: ...
    def result(self, timeout: float) -> NDArray[np.float64] | None: ...
    def kill(self) -> None: ...
    def discard(self) -> None: ...
    def wait_ready(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


# -- the ONNX policy process ---------------------------------------------------------------


@dataclass
class _Job:
    """The one live inference: the process generation it was sent to, when the supervisor
    kills it, and its error (set instead of sending, or by that kill)."""

    gen: int
    deadline: float
    error: str | None = None
    probe: bool = False
    exc: Exception | None = None  # building the observation failed: raised as it is


class OnnxProcessWorker:
    """An uploaded ONNX policy in its own process. Construction starts the process, loads
    the model there and checks it against the spec (DeviceError naming what is wrong; the
    agent's process never runs onnxruntime, so a model that crashes it takes only its own
    process down). `policy` builds observations and maps outputs to commands here.

    `submit(state)` builds the observation in the calling thread and sends it (False while
    an inference is running); `result(timeout)` polls for the output without holding the
    GIL, None if not ready; `kill()` ends a hung inference at once and restarts the process
    in the background (`ready` is false until it has loaded the model again); `close()`
    kills the process and returns at once. An inference still running after
    `max_inference_s` is killed by the worker itself, whoever is (not) collecting it."""

    def __init__(
        self,
        onnx_bytes: bytes,
        spec: PolicySpec,
        info: RobotInfo,
        feed: ObjectFeed | None = None,
        *,
        load_timeout_s: float = LOAD_TIMEOUT_S,
        max_inference_s: float = MAX_INFERENCE_S,
        nice: int = CHILD_NICE,
        name: str = "policy",
    ) -> None:
        self.n = len(info.joint_names)
        self.nice = nice
        self.name = name
        self.load_timeout_s = load_timeout_s
        self.max_inference_s = max_inference_s
        self._model_fd = _model_file(onnx_bytes)
        self.policy: OnnxPolicy  # set once the process has described the model
        self._lock = threading.Lock()  # state below; never held across a blocking call
        self._wake = threading.Condition(self._lock)  # the supervisor waits on it
        self._io_lock = threading.Lock()  # whoever polls/sends/closes a connection
        self._ready = threading.Event()
        self._first = threading.Event()  # the first start ended (loaded or failed)
        self._gen = 0  # bumped by each kill: output of an older process is dropped
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._job: _Job | None = None
        self._want_spawn = True
        self._closed = False
        self._stale: list[tuple[subprocess.Popen[bytes], Connection]] = []
        self._io: ModelIO | None = None
        self._failure: str | None = None  # why the process is not running (given up)
        self.pids_started: list[int] = []  # every policy process this worker started
        self.load_s = float("nan")  # start-to-loaded time of the newest process
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"twinbench-{name}-supervisor", daemon=True
        )
        self._supervisor.start()
        self._first.wait(load_timeout_s + 5.0)
        try:
            if self._io is None:
                raise DeviceError(
                    self._failure
                    or f"policy process did not load the model within {load_timeout_s:g} s"
                )
            self.policy = OnnxPolicy(onnx_bytes, spec, info, feed, model=self._io)
        except BaseException:
            self.close()
            raise

    # -- what the control loop uses --------------------------------------------------------
    @property
    def busy(self) -> bool:
        """An inference is running, or its outcome has not been collected by `result`."""
        return self._job is not None

    @property
    def ready(self) -> bool:
        """The process is alive with the model loaded (false while it restarts after a kill,
        after the worker gave up restarting it, and after close)."""
        return self._ready.is_set() and not self._closed

    @property
    def spawns(self) -> int:
        """Policy processes started so far (the first one and each restart)."""
        return len(self.pids_started)

    @property
    def pid(self) -> int | None:
        """The policy process's pid (None while none runs)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to `timeout` s for `ready` (never call it where the control loop waits)."""
        end = time.monotonic() + timeout
        while not self._closed:
            if self._ready.wait(min(0.05, max(0.0, end - time.monotonic()))):
                return not self._closed
            if time.monotonic() >= end or (self._failure and not self._want_spawn):
                break
        return False

    def submit(self, state: RobotState) -> bool:
        """Build the observation of `state` (in this thread) and start its inference; False
        if the previous one has not been collected. A failure to build or send is not
        raised here but by the next `result`, as an inference error would be."""
        return self._start(state, probe=False)

    def result(self, timeout: float) -> NDArray[np.float64] | None:
        """The output (n float64 values) of the submitted inference, None if it is not ready
        within `timeout` s (or there is none, or it was killed). DeviceError naming the cause
        if it failed: the model's own error text, a dead process, the hard deadline."""
        end = time.perf_counter() + timeout
        with self._lock:
            job, conn = self._job, self._conn
            if job is None:
                return None
            if job.error is not None:
                self._job = None
                raise self._error(job)
        if not self._io_lock.acquire(timeout=max(0.0, timeout)):
            return None
        data: bytes | None = None
        try:
            if conn is None or not conn.poll(max(0.0, end - time.perf_counter())):
                return None
            data = conn.recv_bytes()
        except (EOFError, OSError, ValueError):  # the process died, or was killed meanwhile
            data = None
        finally:
            self._io_lock.release()
        with self._lock:
            if self._job is not job:
                return None  # killed while we read: dropped
            self._job = None
            if job.error is None and data is None:
                job.error = "the policy process ended during the inference (it is restarting)"
                if job.gen == self._gen:
                    self._retire_locked()
            if job.error is not None:
                raise self._error(job)
        assert data is not None
        if data[:1] == RESULT and len(data) == 1 + 8 * self.n:
            return np.frombuffer(data, dtype=np.float64, offset=1).copy()
        job.error = (
            data[1:].decode("utf-8", "replace")
            if data[:1] == ERROR
            else f"malformed reply from the policy process ({len(data)} bytes)"
        )
        raise self._error(job)

    def probe(self, state: RobotState, timeout_s: float) -> NDArray[np.float64]:
        """Run one inference on `state` for the upload check, with a placeholder object pose
        if none has arrived. DeviceError if it fails or takes longer than `timeout_s` (then
        the process is killed and restarted, like `kill`)."""
        if self.busy:
            raise DeviceError("policy is busy with another inference")
        if not self.ready:
            raise DeviceError(f"policy process is not running ({self._failure or 'restarting'})")
        self._start(state, probe=True, deadline_s=max(timeout_s, self.max_inference_s))
        out = self.result(timeout_s)
        if out is None:
            self.kill()
            raise DeviceError(
                f"policy took longer than {timeout_s * 1e3:.0f} ms at its first inference"
            )
        return out

    def discard(self) -> None:
        """Forget the submitted inference (before a policy run starts: its output belongs to
        an older state). A finished one is collected and dropped, errors included; one
        still running is killed (`kill`: not `ready` until the fresh process has loaded)."""
        if self._job is None:
            return
        with contextlib.suppress(DeviceError):
            self.result(0.0)
        if self._job is not None:
            self.kill()

    def kill(self) -> None:
        """End the running inference now (SIGKILL; the caller does not wait) and start a
        fresh process in the background. Its output, if any, is dropped; `busy` is false."""
        with self._lock:
            self._job = None
            if self._proc is not None:
                self._retire_locked()

    def close(self) -> None:
        """Kill the process (SIGKILL) and stop the supervisor, without waiting: safe under
        the agent's lock. The supervisor reaps the process (no zombie) and closes the pipe
        on its way out, within milliseconds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._job = None
            self._ready.clear()
            proc = self._proc
            self._wake.notify_all()
        if proc is not None:
            _sigkill(proc)

    # -- internals ---------------------------------------------------------------------------
    def _start(self, state: RobotState, probe: bool, deadline_s: float | None = None) -> bool:
        with self._lock:
            if self._job is not None:
                return False
            job = _Job(self._gen, time.monotonic() + (deadline_s or self.max_inference_s))
            job.probe = probe
            conn = self._conn if self._ready.is_set() and not self._closed else None
            self._job = job
        try:
            obs = self.policy.observe(state, probe=probe)
        except Exception as exc:  # e.g. no tracked object pose yet: the loop stops on it
            job.error, job.exc = str(exc), exc
            return True
        if conn is None:
            job.error = f"the policy process is not running ({self._failure or 'restarting'})"
            return True
        with self._io_lock:
            try:
                conn.send_bytes(obs.data)
            except (OSError, ValueError):
                job.error = "the policy process ended (it is restarting)"
        with self._lock:
            self._wake.notify_all()  # the supervisor now watches this job's deadline
        return True

    def _error(self, job: _Job) -> Exception:
        if job.exc is not None:
            return job.exc
        text = (job.error or "")[:MAX_ERROR_CHARS]
        if job.probe:
            return DeviceError(f"policy failed its first inference: {text}")
        return DeviceError(f"policy inference failed: {text}")

    def _retire_locked(self) -> None:
        """SIGKILL the current process, hand it to the supervisor to reap, and have it start
        a fresh one (with the lock held)."""
        proc, conn = self._proc, self._conn
        self._gen += 1
        self._proc = self._conn = None
        self._ready.clear()
        if proc is not None and conn is not None:
            _sigkill(proc)
            self._stale.append((proc, conn))
        self._want_spawn = not self._closed
        self._wake.notify_all()

    def _supervise(self) -> None:
        """Starts the process (and restarts it after a kill or death), kills inferences past
        their deadline, reaps killed processes. Runs at normal priority whoever created it."""
        normal_priority_thread()
        failures = 0
        try:
            while True:
                with self._lock:
                    while not (self._closed or self._stale or self._want_spawn):
                        job, now = self._job, time.monotonic()
                        if job is not None and job.error is None and now >= job.deadline:
                            job.error = (
                                "the inference ran past its deadline "
                                f"({self.max_inference_s * 1e3:.0f} ms); its process was "
                                "killed (restarting)"
                            )
                            self._retire_locked()
                            break
                        if self._proc is not None and self._proc.poll() is not None:
                            self._failure = "the policy process ended unexpectedly"
                            if self._job is not None and self._job.error is None:
                                self._job.error = self._failure + " (restarting)"
                            self._retire_locked()
                            break
                        wait = SUPERVISE_S
                        if job is not None and job.error is None:
                            wait = min(wait, max(0.0, job.deadline - now) + 0.001)
                        self._wake.wait(wait)
                    closed, stale, self._stale = self._closed, self._stale, []
                    spawn = self._want_spawn and not closed
                for proc, conn in stale:
                    self._reap(proc, conn)
                if closed:
                    return
                if spawn:
                    if self._spawn():
                        failures = 0
                    else:
                        failures += 1
                        with self._lock:
                            if failures >= RESPAWN_TRIES or not self._first.is_set():
                                self._want_spawn = False  # given up: not ready
                        self._first.set()
                        time.sleep(0.2 * failures)
        finally:
            with self._lock:
                self._closed, self._want_spawn = True, False
                self._ready.clear()
                left = [*self._stale]
                if self._proc is not None and self._conn is not None:
                    left.append((self._proc, self._conn))
                self._proc = self._conn = None
                self._stale = []
            for proc, conn in left:
                _sigkill(proc)
                self._reap(proc, conn)
            with contextlib.suppress(OSError):
                os.close(self._model_fd)
            self._first.set()

    def _spawn(self) -> bool:
        """Start a process and wait (here, in the supervisor) until it has loaded the model.
        False, with `_failure` saying why, if it did not."""
        with self._lock:
            gen = self._gen
        t0 = time.perf_counter()
        ours, theirs = socket.socketpair()
        try:
            # from this (supervisor) thread: the child's PR_SET_PDEATHSIG is tied to it
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE, str(theirs.fileno()), str(self._model_fd)]
                + [str(self.n), str(os.getpid()), str(self.nice)],
                pass_fds=(theirs.fileno(), self._model_fd),
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
        except Exception as exc:
            ours.close()
            self._failure = f"policy process did not start ({exc})"
            return False
        finally:
            theirs.close()
        parent = Connection(ours.detach())
        self.pids_started.append(proc.pid)
        failure: str | None = None
        io: ModelIO | None = None
        try:
            end = time.monotonic() + self.load_timeout_s
            while not parent.poll(0.05):
                if self._closed or self._gen != gen:
                    failure = "closed"
                    break
                if time.monotonic() > end:
                    failure = (
                        f"policy process did not load the model within {self.load_timeout_s:g} s"
                    )
                    break
            else:
                msg = parent.recv_bytes()
                if msg[:1] == LOADED:
                    io = ModelIO.from_json(msg[1:].decode())
                else:
                    failure = msg[1:].decode("utf-8", "replace")[:MAX_ERROR_CHARS]
        except (EOFError, OSError) as exc:
            failure = f"policy process ended while loading the model ({exc or 'no reply'})"
        with self._lock:
            if failure is None and (self._closed or self._gen != gen):
                failure = "closed"
            if failure is None:
                self._proc, self._conn, self._io = proc, parent, io
                self._want_spawn, self._failure = False, None
                self.load_s = time.perf_counter() - t0
                self._ready.set()
                self._first.set()
                return True
            if failure != "closed":
                self._failure = failure
        _sigkill(proc)
        self._reap(proc, parent)
        return failure == "closed"

    def _reap(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        """Wait for a killed process to be gone (no zombie left), then close its pipe (under
        the io lock: a `result` may still be polling it)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        with self._io_lock:
            conn.close()


def _model_file(data: bytes) -> int:
    """A file descriptor holding the model, which each policy process reads for itself (no
    pipe the supervisor could block on while a child does not read): an anonymous memory
    file on Linux, an unlinked temporary file elsewhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("twinbench-policy-model", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        fd = os.dup(tempfile.TemporaryFile().fileno())
    with open(fd, "wb", closefd=False) as f:
        f.write(data)
    return fd


def _sigkill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL at once: a policy process has nothing to save, and a hung C++ kernel would
    not see a SIGTERM handler anyway."""
    with contextlib.suppress(OSError):
        proc.kill()  # no-op once it has been reaped (its pid may be someone else's by then)


# -- in the policy process -------------------------------------------------------------------
def child_main() -> None:
    """The policy process (argv: the socket's fd, the model file's fd, the joint count, the
    agent's pid): lower its priority, load the model, answer observations until the socket
    closes. Dies with the agent (PR_SET_PDEATHSIG on the thread that started it, and a
    watcher thread)."""
    fd, model_fd, n, agent_pid, nice = (int(a) for a in sys.argv[1:6])
    conn = Connection(fd)
    lower_priority(nice)
    _die_with_parent(agent_pid)
    size, model = os.fstat(model_fd).st_size, bytearray()
    while len(model) < size:  # pread: the file offset is shared with the agent's copy
        chunk = os.pread(model_fd, size - len(model), len(model))
        if not chunk:
            break
        model += chunk
    os.close(model_fd)
    try:
        session = load_session(bytes(model), log_severity=4)  # errors travel back as text
        io = ModelIO.of_session(session)
    except Exception as exc:
        conn.send_bytes(LOAD_FAILED + str(exc).encode("utf-8", "replace"))
        return
    del model
    conn.send_bytes(LOADED + io.to_json().encode())
    input_name, input_shape = io.inputs[0] if io.inputs else ("", ())
    output_name = io.outputs[0] if io.outputs else ""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            obs = np.frombuffer(data, dtype=np.float32)
            obs = obs.reshape(obs_shape(input_shape, obs.size))
            out = session.run([output_name], {input_name: obs})[0]
            reply = RESULT + output_values(out, n).tobytes()
        except Exception as exc:  # onnxruntime's own error text names the failing node
            reply = ERROR + str(exc)[:MAX_ERROR_CHARS].encode("utf-8", "replace")
        try:
            conn.send_bytes(reply)
        except OSError:
            return


def lower_priority(nice: int = CHILD_NICE) -> None:
    """SCHED_OTHER and at least `nice` for the calling thread (on Linux both are per
    thread; threads created afterwards inherit them), whatever the process inherited."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))


def _die_with_parent(agent_pid: int) -> None:
    """End this process when the agent ends, even in the middle of an inference: the kernel
    sends SIGKILL when the thread that started it ends (the worker's supervisor: it ends with
    the worker or the agent), and a watcher thread notices a new parent pid (orphaned)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != agent_pid:  # it ended before prctl took effect
        os._exit(0)

    def watch() -> None:
        while os.getppid() == agent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="policy-parent-watch", daemon=True).start()


# -- in-process Python policies --------------------------------------------------------------
class PolicyWorker:
    """A Python callable `fn(state) -> output` on its own normal-priority thread:
    `submit(state)` then `result(timeout)`, the output or None while it is not ready (call
    `result` again on a later tick; `busy` stays true until it is collected).

    For trusted local code only (`Agent.load_policy`: tests, fuzzing): Python cannot be
    killed from outside. `kill()` abandons a running call (its output is dropped) and the
    worker is not `ready` until that call returns; uploaded models run in
    `OnnxProcessWorker`, which can be killed."""

    def __init__(
        self, fn: PolicyFn, name: str = "policy", realtime_priority: int | None = None
    ) -> None:
        # `realtime_priority` is ignored: inference must never run at (or above) the control
        # loop's priority. Accepted until the agent stops passing it.
        self.fn = fn
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._done = threading.Event()
        self._idle = threading.Event()  # not inside an abandoned call
        self._idle.set()
        self._state: RobotState | None = None
        self._out: NDArray[np.float64] | None = None
        self._exc: BaseException | None = None
        self._busy = False
        self._closed = False
        self._gen = 0  # bumped by `kill`: the call in progress then belongs to no one
        self._calling = False  # the thread is inside `fn`
        self._thread = threading.Thread(target=self._run, name=f"twinbench-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        normal_priority_thread()  # created by whichever thread; never the loop's priority
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            with self._lock:
                gen, state, self._calling = self._gen, self._state, True
            out: Any = None
            exc: BaseException | None = None
            try:
                out = self.fn(state)  # type: ignore[arg-type]
            except BaseException as e:  # handed to the control loop, which stops the robot
                exc = e
            with self._lock:
                self._calling = False
                self._idle.set()
                if gen == self._gen:  # not abandoned by `kill`
                    self._out, self._exc = out, exc
                    self._done.set()

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def ready(self) -> bool:
        """The thread runs and is not stuck in a call `kill` abandoned."""
        return not self._closed and self._thread.is_alive() and self._idle.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._idle.wait(timeout) and self.ready

    def submit(self, state: RobotState) -> bool:
        """Start inference on `state`; False if the previous one has not finished."""
        with self._lock:
            if self._busy or self._closed:
                return False
            self._busy = True
            self._state = state
            self._done.clear()
        self._go.set()
        return True

    def result(self, timeout: float) -> NDArray[np.float64] | None:
        """The output, None if not ready within `timeout` s; re-raises the policy's error."""
        if not self._busy or not self._done.wait(timeout):
            return None
        with self._lock:
            if not self._done.is_set():  # abandoned by `kill` meanwhile
                return None
            out, exc = self._out, self._exc
            self._out = self._exc = None
            self._done.clear()
            self._busy = False
        if exc is not None:
            raise exc
        return out

    def discard(self) -> None:
        """Forget the submitted call: a finished one's output (or error) is dropped, a
        running one abandoned (`kill`)."""
        if not self._busy:
            return
        with contextlib.suppress(Exception):
            self.result(0.0)
        self.kill()

    def kill(self) -> None:
        """Abandon the running call (it cannot be stopped; its output is dropped)."""
        with self._lock:
            if self._busy:
                self._gen += 1
                self._busy = False
                self._done.clear()
                if self._calling:
                    self._idle.clear()

    def close(self) -> None:
        """Stop the thread without waiting for it (safe under the agent's lock): an idle
        thread ends at once, one inside a hanging call when (if) the call returns."""
        self._closed = True
        self._go.set()
