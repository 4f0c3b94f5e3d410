"""3D scene view: meshes, point clouds, coordinate frames and a ground grid from numpy values.

```
view = SceneView()
view.set_mesh("table", vertices, faces, color=(0.6, 0.5, 0.4, 1.0), transform=T_world_table)
view.set_points("cloud", xyz, colors)          # colors (N,3|4) in [0, 1] or one RGBA
view.set_frame("ee", T_base_ee, size=0.1)      # x red, y green, z blue
view.remove("cloud"); view.clear()
```
Z is up, units are metres. Drag to orbit, middle-drag (or Ctrl+drag) to pan, wheel to zoom.
Items are kept by name in a plain model (`items()`), so the view keeps working — and tests can
check what it holds — where OpenGL is unavailable (e.g. the offscreen Qt platform): it then
shows a message saying so instead of the 3D drawing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from PySide6 import QtCore, QtGui, QtWidgets

log = logging.getLogger(__name__)

Color = tuple[float, float, float, float]
BACKGROUND = (38, 41, 46)

_gl_ok: bool | None = None
_gl_why = ""


def opengl_available() -> tuple[bool, str]:
    """Whether this Qt platform can create an OpenGL context (checked once per process)."""
    global _gl_ok, _gl_why
    if _gl_ok is None:
        app = QtGui.QGuiApplication.instance()
        platform = QtGui.QGuiApplication.platformName() if app else "none"
        if platform == "xcb" and os.environ.get("PYOPENGL_PLATFORM") == "egl":
            # Qt's xcb plugin makes GLX contexts; PyOpenGL bound to EGL cannot use them.
            os.environ.pop("PYOPENGL_PLATFORM")
        ctx = QtGui.QOpenGLContext()
        _gl_ok = bool(ctx.create())
        _gl_why = "" if _gl_ok else f"OpenGL is not available on the Qt platform '{platform}'"
        if _gl_ok:
            try:
                import pyqtgraph.opengl  # noqa: F401  (imports PyOpenGL)
            except Exception as exc:  # missing libGL, broken PyOpenGL
                _gl_ok, _gl_why = False, f"PyOpenGL could not be loaded ({exc})"
    return _gl_ok, _gl_why


@dataclass
class SceneItem:
    """One named item of the scene model: what was asked for, independent of drawing."""

    kind: str  # "mesh" | "points" | "frame"
    data: dict[str, Any]
    gl: list[Any]


LIGHT_DIR = np.array([0.35, -0.45, 0.82]) / np.linalg.norm([0.35, -0.45, 0.82])


def shade_faces(
    vertices: NDArray[np.float32], faces: NDArray[np.int32], rgba: Color, R: NDArray[np.float64]
) -> NDArray[np.float32]:
    """Per-face colours lit by a fixed world light (two-sided Lambert + ambient), so
    meshes read well whatever their winding; R rotates local normals into the world."""
    if not len(faces):
        return np.zeros((0, 4), np.float32)
    tri = vertices[faces]
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]) @ R.T
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
    k = 0.38 + 0.62 * np.abs(n @ LIGHT_DIR)
    out = np.empty((len(faces), 4), np.float32)
    out[:, :3] = np.clip(np.asarray(rgba[:3])[None, :] * k[:, None], 0, 1)
    out[:, 3] = rgba[3]
    return out


def _mat(T: ArrayLike | None) -> NDArray[np.float64]:
    M = np.eye(4) if T is None else np.asarray(T, dtype=float)
    if M.shape != (4, 4) or not np.all(np.isfinite(M)):
        raise ValueError(f"transform must be a finite 4x4 matrix, got shape {M.shape}")
    return M


def _qmat(T: NDArray[np.float64]) -> QtGui.QMatrix4x4:
    return QtGui.QMatrix4x4(*[float(v) for v in T.reshape(-1)])


def _rgba(c: ArrayLike) -> Color:
    a = [float(v) for v in np.asarray(c, dtype=float).reshape(-1)]
    if len(a) == 3:
        a.append(1.0)
    if len(a) != 4:
        raise ValueError(f"colour must be RGB or RGBA in [0, 1], got {c!r}")
    return (a[0], a[1], a[2], a[3])


def share_gl_contexts() -> None:
    """Before the QApplication exists: every OpenGL context shares with one global context.
    A 3D view in its own window (`SceneView(native_window=True)`) needs it: pyqtgraph
    keeps some shader programs per class, not per context."""
    if QtWidgets.QApplication.instance() is None:
        QtCore.QCoreApplication.setAttribute(QtCore.Qt.ApplicationAttribute.AA_ShareOpenGLContexts)


def grab_widget(widget: QtWidgets.QWidget) -> QtGui.QPixmap:
    """`widget.grab()` with the 3D views that draw in windows of their own painted in."""
    pix = widget.grab()
    views = [v for v in widget.findChildren(SceneView) if v.native and v.isVisible()]
    if views:
        painter = QtGui.QPainter(pix)
        for v in views:
            at = v.mapTo(widget, QtCore.QPoint(0, 0))
            img = v.grab_image()
            painter.drawImage(QtCore.QRect(at, v.size()), img)
        painter.end()
    return pix


def _native_gl_view() -> Any:
    """pyqtgraph's GL view on a QOpenGLWindow sharing the global context (its mixin is made
    for either base); None without a global context (see `share_gl_contexts`)."""
    from pyqtgraph.opengl.GLViewWidget import GLViewMixin
    from PySide6.QtOpenGL import QOpenGLWindow

    share = QtGui.QOpenGLContext.globalShareContext()
    if share is None:
        return None

    class GLViewWindow(GLViewMixin, QOpenGLWindow):  # type: ignore[misc]
        pass

    return GLViewWindow(share)


class SceneView(QtWidgets.QWidget):
    """A named-item 3D scene (pyqtgraph.opengl GLViewWidget), degrading to a message."""

    def __init__(
        self,
        parent: QtWidgets.QWidget | None = None,
        grid_size_m: float = 2.0,
        native_window: bool = False,
    ) -> None:
        """`native_window`: draw in a window of its own (a QOpenGLWindow in a container)
        instead of a QOpenGLWidget. A QOpenGLWidget makes Qt compose the whole top-level
        window through OpenGL at every repaint of any widget in it (a software renderer:
        ~15 ms a repaint at 1366x768); a native window repaints only itself. Its pixels
        are then not in `QWidget.grab()`: screenshots use `grab_widget`."""
        super().__init__(parent)
        self._items: dict[str, SceneItem] = {}
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        ok, why = opengl_available()
        self.gl_view: Any = None
        self.native = False  # the 3D view is a window of its own (see native_window)
        self.message = QtWidgets.QLabel("")
        self.message.setWordWrap(True)
        self.message.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        if ok:
            import pyqtgraph.opengl as gl

            native = _native_gl_view() if native_window else None
            self.gl_view = native if native is not None else gl.GLViewWidget()
            self.native = native is not None
            self.gl_view.setBackgroundColor(BACKGROUND)
            self.gl_view.setCameraPosition(distance=2.0, elevation=22, azimuth=-55)
            self.gl_view.opts["center"] = QtGui.QVector3D(0.25, 0.0, 0.3)
            grid = gl.GLGridItem()
            grid.setSize(grid_size_m, grid_size_m)
            grid.setSpacing(0.1, 0.1)
            grid.setColor((255, 255, 255, 40))
            self.gl_view.addItem(grid)
            self.grid = grid
            self._world = self._frame_lines(np.eye(4), 0.2, width=2.0)
            for it in self._world:
                self.gl_view.addItem(it)
            if native is not None:
                box = QtWidgets.QWidget.createWindowContainer(self.gl_view, self)
                box.setFocusPolicy(QtCore.Qt.FocusPolicy.ClickFocus)
                lay.addWidget(box)
            else:
                lay.addWidget(self.gl_view)
            self.message.hide()
        else:
            self.grid = None
            self.message.setText(
                f"3D view unavailable: {why}.\nThe scene is kept and will be "
                "listed here; run on a desktop with OpenGL to see it."
            )
            self.message.setStyleSheet("color: #b0b0b0; background: rgb(38,41,46); padding: 12px;")
            self.message.setMinimumHeight(120)
        lay.addWidget(self.message)
        self.setMinimumSize(160, 120)

    # -- model ---------------------------------------------------------------------------
    @property
    def has_gl(self) -> bool:
        return self.gl_view is not None

    def items(self) -> dict[str, SceneItem]:
        """The scene model: name -> item (kind and the values it was given)."""
        return dict(self._items)

    def remove(self, name: str) -> None:
        item = self._items.pop(name, None)
        if item is not None and self.gl_view is not None:
            for g in item.gl:
                self.gl_view.removeItem(g)
        self._update_message()

    def clear(self) -> None:
        for name in list(self._items):
            self.remove(name)

    def _put(self, name: str, kind: str, data: dict[str, Any], make: Any) -> None:
        old = self._items.get(name)
        if old is not None and old.kind == kind and self.gl_view is not None and kind != "mesh":
            make(old.gl)  # update in place: no GL buffer churn at live refresh rates
            old.data = data
            return
        self.remove(name)
        gl_items = make(None) if self.gl_view is not None else []
        for g in gl_items:
            self.gl_view.addItem(g)
        self._items[name] = SceneItem(kind, data, gl_items)
        self._update_message()

    def _update_message(self) -> None:
        if self.gl_view is None:
            base = self.message.text().split("\n\nScene:")[0]
            listing = ", ".join(f"{n} ({i.kind})" for n, i in self._items.items()) or "empty"
            self.message.setText(f"{base}\n\nScene: {listing}")

    # -- items ---------------------------------------------------------------------------
    def set_mesh(
        self,
        name: str,
        vertices: ArrayLike,
        faces: ArrayLike,
        color: ArrayLike = (0.7, 0.7, 0.75, 1.0),
        transform: ArrayLike | None = None,
        edges: bool = False,
    ) -> None:
        """Add or replace a triangle mesh: vertices (N,3) m, faces (M,3) int, RGBA colour."""
        v = np.asarray(vertices, dtype=np.float32)
        f = np.asarray(faces, dtype=np.int32)
        if v.ndim != 2 or v.shape[1] != 3 or f.ndim != 2 or f.shape[1] != 3:
            raise ValueError(
                f"mesh '{name}': vertices must be (N,3) and faces (M,3), "
                f"got {v.shape} and {f.shape}"
            )
        if f.size and (f.min() < 0 or f.max() >= len(v)):
            raise ValueError(f"mesh '{name}': face index out of range 0..{len(v) - 1}")
        T, rgba = _mat(transform), _rgba(color)

        def make(existing: Any) -> list[Any]:
            import pyqtgraph.opengl as gl

            m = gl.GLMeshItem(
                vertexes=v,
                faces=f,
                faceColors=shade_faces(v, f, rgba, T[:3, :3]),
                smooth=False,
                drawEdges=edges,
                edgeColor=(0, 0, 0, 0.5),
            )
            m.setGLOptions("opaque" if rgba[3] >= 1.0 else "translucent")
            m.setTransform(_qmat(T))
            return [m]

        self._put(name, "mesh", {"vertices": v, "faces": f, "color": rgba, "transform": T}, make)

    def set_points(
        self, name: str, xyz: ArrayLike, colors: ArrayLike | None = None, size_px: float = 3.0
    ) -> None:
        """Add or replace a point cloud: xyz (N,3) m; colours (N,3|4) in [0,1] or one RGBA."""
        p = np.asarray(xyz, dtype=np.float32).reshape(-1, 3)
        if colors is None:
            c: Any = (0.9, 0.9, 0.9, 1.0)
        else:
            ca = np.asarray(colors, dtype=np.float32)
            if ca.ndim == 2:
                if ca.shape[0] != len(p):
                    raise ValueError(f"points '{name}': {len(p)} points but {ca.shape[0]} colours")
                if ca.max(initial=0) > 1.0:  # uint8-style colours
                    ca = ca / 255.0
                c = (
                    np.concatenate([ca[:, :3], np.ones((len(ca), 1), np.float32)], 1)
                    if ca.shape[1] == 3
                    else ca
                )
            else:
                c = _rgba(ca)

        def make(existing: Any) -> list[Any]:
            import pyqtgraph.opengl as gl

            if existing:
                existing[0].setData(pos=p, color=c, size=size_px)
                return list(existing)
            sc = gl.GLScatterPlotItem(pos=p, color=c, size=size_px, pxMode=True)
            sc.setGLOptions("translucent")  # not additive: dense clouds keep their colour
            return [sc]

        self._put(name, "points", {"xyz": p, "colors": c}, make)

    def set_frame(self, name: str, T: ArrayLike, size: float = 0.1, width: float = 3.0) -> None:
        """Add or replace a coordinate frame (axes triad) at the 4x4 pose `T`, axes `size` m."""
        M = _mat(T)

        def make(existing: Any) -> list[Any]:
            if existing:
                for i, line in enumerate(existing):
                    line.setData(pos=np.array([M[:3, 3], M[:3, 3] + size * M[:3, i]]))
                return list(existing)
            return self._frame_lines(M, size, width)

        self._put(name, "frame", {"T": M, "size": size}, make)

    def set_polyline(
        self, name: str, xyz: ArrayLike, color: ArrayLike = (1, 0.8, 0.2, 1), width: float = 2.0
    ) -> None:
        """Add or replace a connected line through points xyz (N,3), e.g. a robot's links."""
        p = np.asarray(xyz, dtype=np.float32).reshape(-1, 3)
        rgba = _rgba(color)

        def make(existing: Any) -> list[Any]:
            import pyqtgraph.opengl as gl

            if existing:
                existing[0].setData(pos=p, color=rgba, width=width)
                return list(existing)
            return [gl.GLLinePlotItem(pos=p, color=rgba, width=width, antialias=True)]

        self._put(name, "line", {"xyz": p, "color": rgba}, make)

    @staticmethod
    def _frame_lines(M: NDArray[np.float64], size: float, width: float = 3.0) -> list[Any]:
        import pyqtgraph.opengl as gl

        out = []
        for i, col in enumerate(((1, 0.2, 0.2, 1), (0.2, 1, 0.2, 1), (0.3, 0.5, 1, 1))):
            pts = np.array([M[:3, 3], M[:3, 3] + size * M[:3, i]])
            out.append(gl.GLLinePlotItem(pos=pts, color=col, width=width, antialias=True))
        return out

    # -- camera / output -----------------------------------------------------------------
    def look_at(self, center: ArrayLike, distance: float | None = None) -> None:
        """Point the orbit camera at `center` (m), optionally at `distance` m."""
        if self.gl_view is not None:
            c = np.asarray(center, dtype=float)
            self.gl_view.opts["center"] = QtGui.QVector3D(*[float(x) for x in c[:3]])
            if distance is not None:
                self.gl_view.opts["distance"] = float(distance)
            self.gl_view.update()

    def grab_image(self) -> QtGui.QImage:
        """The current drawing as an image (the message label when there is no OpenGL)."""
        if self.native:  # a window draws on its next frame: draw now
            self.gl_view.makeCurrent()
            self.gl_view.paintGL()
        if self.gl_view is not None:
            return self.gl_view.grabFramebuffer()
        return self.grab().toImage()


if __name__ == "__main__":  # preview: a box, a point cloud, frames
    import sys

    qapp = QtWidgets.QApplication(sys.argv)
    view = SceneView()
    import trimesh

    table = trimesh.creation.box(extents=(0.8, 0.6, 0.05))
    table.apply_translation((0.5, 0.0, 0.025))
    box_v, box_f = np.asarray(table.vertices), np.asarray(table.faces)
    view.set_mesh("table", box_v, box_f, (0.55, 0.45, 0.35, 1))
    rng = np.random.default_rng(0)
    pts = rng.normal([0.5, 0.0, 0.2], 0.05, (2000, 3))
    view.set_points("cloud", pts, rng.uniform(0, 1, (2000, 3)))
    T = np.eye(4)
    T[:3, 3] = [0.5, 0.0, 0.4]
    view.set_frame("ee", T, 0.15)
    view.resize(800, 600)
    view.show()
    from widgets.pages import exec_preview

    sys.exit(exec_preview(qapp, view))
