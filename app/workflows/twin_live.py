"""A twin world that lives on its own thread (the Twin page's engine; Qt-free).

The GUI thread only draws (docs/ARCHITECTURE.md §5): stepping, parameter edits (which rebuild the PyBullet
world), object moves and "save as new twin" (URDF export, disk writes) all run here, on a
thread this object owns. Views send commands (`play`, `step`, `reset`, `set_values`,
`move_object`, `save`) that return at once, and receive `TwinFrame`s: the newest state to
draw. Frames are "latest wins": `on_frame` is called at most once until the view has taken
the frame with `take_frame()`, so a slow view never builds a backlog.

Parameter edits coalesce: all edits waiting when the worker wakes become one rebuild with
the newest value of each parameter.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from app.workflows.twin import TwinSession
from resources.errors import TwinbenchError
from resources.project import Project

log = logging.getLogger(__name__)

PLAY_HZ = 20.0  # frames per second while playing (each redraw costs ~15 ms in software GL)
MAX_CATCH_UP_S = 0.1  # when the world steps slower than real time, drop time, not frames


@dataclass(frozen=True)
class TwinFrame:
    """What a view needs to draw the twin now."""

    seq: int
    time_s: float
    poses: Mapping[str, np.ndarray]  # body name -> 4x4 world pose
    values: Mapping[str, float]
    object_poses: Mapping[str, tuple[float, ...]]  # object -> start pose (xyz + quat xyzw)
    edited: bool
    playing: bool
    twin_id: str | None
    realtime_factor: float | None = None  # sim seconds per wall second while playing
    message: str = ""  # "saved as twin-…"
    error: str = ""  # the last command that failed, and why
    saved_id: str | None = None


@dataclass
class _Command:
    kind: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class LiveTwin:
    """Owns `session` and a worker thread that steps and edits it.

    `on_frame()` is called from the worker thread (at most once per `take_frame()`); a view
    marshals it to its own thread and calls `take_frame()` there."""

    def __init__(
        self, session: TwinSession, on_frame: Callable[[], None], play_hz: float = PLAY_HZ
    ) -> None:
        self.session = session
        self._on_frame = on_frame
        self._period = 1.0 / play_hz
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._lock = threading.Lock()
        self._latest: TwinFrame | None = None
        self._notified = False
        self._seq = 0
        self._playing = False
        self._rtf: float | None = None
        self.steps_taken = 0  # world steps of play/step (tests and the bench read it)
        self._thread = threading.Thread(target=self._run, name="twin-live", daemon=True)
        self._thread.start()
        self._send("publish")

    # -- commands (any thread; return at once) ---------------------------------------------
    def play(self, on: bool) -> None:
        self._send("play", bool(on))

    def step(self, seconds: float = 1.0 / PLAY_HZ) -> None:
        self._send("step", float(seconds))

    def reset(self) -> None:
        self._send("reset")

    def set_values(self, values: Mapping[str, float]) -> None:
        self._send("values", dict(values))

    def move_object(self, name: str, pose: Any) -> None:
        self._send("move", name, tuple(float(v) for v in pose))

    def save(self, project: Project, summary: str = "edited in the Twin page") -> None:
        """Save the current values as a new twin artifact; the frame says the new id."""
        self._send("save", project, summary)

    def close(self, timeout_s: float = 10.0, wait: bool = True) -> None:
        """Stop the worker (after the command it is running) and close the world;
        `wait=False` returns at once (the worker closes the world on its own)."""
        if self._thread.is_alive():
            self._send("close")
            if not wait:
                return
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("twin worker did not stop within %.0f s", timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def take_frame(self) -> TwinFrame | None:
        """The newest frame (None before the first); re-arms `on_frame`."""
        with self._lock:
            self._notified = False
            return self._latest

    def latest_frame(self) -> TwinFrame | None:
        """The newest frame without re-arming `on_frame` (for tests)."""
        with self._lock:
            return self._latest

    def _send(self, kind: str, *args: Any) -> None:
        self._commands.put(_Command(kind, args))

    # -- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = time.monotonic()
        play_wall0 = play_sim0 = 0.0
        try:
            while True:
                timeout = max(0.0, next_tick - time.monotonic()) if self._playing else None
                cmds = self._drain(timeout)
                if any(c.kind == "close" for c in cmds):
                    return
                changed = self._apply(cmds)
                if self._playing and time.monotonic() >= next_tick:
                    now = time.monotonic()
                    lag = min(now - next_tick + self._period, self._period + MAX_CATCH_UP_S)
                    self._advance(lag)
                    next_tick = max(next_tick + self._period, now)
                    if now - play_wall0 > 0.5:
                        if play_wall0 > 0:
                            self._rtf = (self.session.time - play_sim0) / (now - play_wall0)
                        play_wall0, play_sim0 = now, self.session.time
                    changed = True
                elif not self._playing:
                    play_wall0 = 0.0
                    next_tick = time.monotonic()
                if changed:
                    self._publish()
        except Exception:  # keep the view informed; never die silently
            log.exception("the twin worker stopped")
            self._publish(error="the twin worker stopped unexpectedly (see the log)")
        finally:
            try:
                self.session.close()
            except Exception:
                log.exception("closing the twin world failed")

    def _drain(self, timeout: float | None) -> list[_Command]:
        try:
            first = self._commands.get(timeout=timeout) if timeout != 0.0 else None
        except queue.Empty:
            return []
        cmds = [first] if first is not None else []
        while True:
            try:
                cmds.append(self._commands.get_nowait())
            except queue.Empty:
                return cmds

    def _apply(self, cmds: list[_Command]) -> bool:
        """Run the commands in order (parameter edits coalesced); True if the view must
        redraw."""
        changed = False
        values: dict[str, float] = {}
        for c in cmds:
            if c.kind == "values":
                values.update(c.args[0])
                continue
            if values:  # an edit before another command takes effect before it
                changed |= self._guard("parameter edit", self.session.set_values, values)
                values = {}
            if c.kind == "publish":
                changed = True
            elif c.kind == "play":
                self._playing = bool(c.args[0])
                self._rtf = None
                changed = True
            elif c.kind == "step":
                self._advance(c.args[0])
                changed = True
            elif c.kind == "reset":
                changed |= self._guard("reset", self.session.reset)
            elif c.kind == "move":
                changed |= self._guard("moving the object", self.session.move_object, *c.args)
            elif c.kind == "save":
                self._save(*c.args)
                changed = False  # _save published
        if values:
            changed |= self._guard("parameter edit", self.session.set_values, values)
        return changed

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            fn(*args)
        except TwinbenchError as exc:  # names the parameter/object; the old world is kept
            self._publish(error=f"{what} failed: {exc}")
            return False
        return True

    def _advance(self, seconds: float) -> None:
        try:
            self.session.step(seconds)
            self.steps_taken += 1
        except TwinbenchError as exc:
            self._playing = False
            self._publish(error=f"stepping failed: {exc}")

    def _save(self, project: Project, summary: str) -> None:
        try:
            new_id = self.session.save(project, summary)
        except (TwinbenchError, OSError) as exc:
            self._publish(error=f"saving failed: {exc}")
            return
        log.info("saved twin %s (edit of %s)", new_id, self.session.spec.meta.get("parent_twin"))
        self._publish(message=f"saved as {new_id}", saved_id=new_id)

    def _publish(self, message: str = "", error: str = "", saved_id: str | None = None) -> None:
        s = self.session
        self._seq += 1
        frame = TwinFrame(
            seq=self._seq,
            time_s=s.time,
            poses=s.poses(),
            values=dict(s.values),
            object_poses={o.name: tuple(o.pose) for o in s.spec.objects},
            edited=s.edited,
            playing=self._playing,
            twin_id=s.twin_id,
            realtime_factor=self._rtf,
            message=message,
            error=error,
            saved_id=saved_id,
        )
        with self._lock:
            prev = self._latest
            if self._notified and prev is not None:  # not yet taken: keep its news
                frame = replace(
                    frame,
                    message=frame.message or prev.message,
                    error=frame.error or prev.error,
                    saved_id=frame.saved_id or prev.saved_id,
                )
            self._latest = frame
            notify = not self._notified
            self._notified = True
        if notify:
            self._on_frame()
