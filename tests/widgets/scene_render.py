"""Helper run in a subprocess under Xvfb by test_xvfb.py: draw a scene with real OpenGL and
report what the frame buffer shows as JSON (`python -m tests.widgets.scene_render OUT.json
[--native]`; --native: the view in a window of its own, as the Calibrate page has it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import trimesh
from PySide6 import QtGui, QtWidgets

from widgets.scene_view import SceneView, share_gl_contexts

_BOX = trimesh.creation.box(extents=(0.4, 0.4, 0.4))  # a cube of 0.4 m about the origin
BOX_V, BOX_F = np.asarray(_BOX.vertices), np.asarray(_BOX.faces)


def count(img) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Pixels that are clearly red / clearly green / differ from the background."""
    w, h = img.width(), img.height()
    ptr = img.convertToFormat(img.Format.Format_RGB888)
    arr = np.frombuffer(ptr.constBits(), np.uint8)[: h * ptr.bytesPerLine()]
    arr = arr.reshape(h, ptr.bytesPerLine())[:, : w * 3].reshape(h, w, 3).astype(int)
    r, g, b = arr[..., 0], arr[..., 1], arr[..., 2]
    return {
        "red": int(((r > 120) & (g < 80) & (b < 80)).sum()),
        "green": int(((g > 150) & (r < 100) & (b < 100)).sum()),
        "non_background": int((np.abs(arr - [38, 41, 46]).sum(-1) > 30).sum()),
    }


def main(out: Path, native: bool = False) -> int:
    share_gl_contexts()
    app = QtWidgets.QApplication([sys.argv[0]])
    view = SceneView(native_window=native)
    view.resize(400, 300)
    view.show()
    result: dict[str, object] = {"has_gl": view.has_gl, "platform": app.platformName()}
    result["native"] = isinstance(view.gl_view, QtGui.QWindow)
    view.look_at((0, 0, 0), 2.0)
    view.set_mesh("box", BOX_V, BOX_F, (0.9, 0.1, 0.1, 1.0))
    T = np.eye(4)
    T[:3, 3] = [0.0, 0.0, 0.3]
    view.set_frame("frame", T, size=0.3)
    rng = np.random.default_rng(0)
    view.set_points(
        "cloud", rng.normal([0.0, -0.5, 0.0], 0.03, (500, 3)), (0.1, 0.9, 0.1, 1.0), size_px=4
    )
    for _ in range(5):
        app.processEvents()
    img = view.grab_image()
    img.save(str(out.with_suffix(".png")))
    result["with_items"] = count(img)
    view.remove("box")
    view.remove("cloud")
    app.processEvents()
    result["after_remove"] = count(view.grab_image())
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), "--native" in sys.argv[2:]))
