"""Scene view model and offscreen fallback. Real GL drawing is checked under Xvfb in
test_xvfb.py (the offscreen Qt platform has no OpenGL)."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

pytestmark = pytest.mark.gui

_BOX = trimesh.creation.box(extents=(0.2, 0.2, 0.2))  # a cube of 0.2 m from the origin
BOX_V, BOX_F = np.asarray(_BOX.vertices) + 0.1, np.asarray(_BOX.faces)


@pytest.fixture
def view(qtbot):  # type: ignore[no-untyped-def]
    from widgets.scene_view import SceneView

    v = SceneView()
    qtbot.addWidget(v)
    v.resize(400, 300)
    v.show()
    return v


def test_items_kept_by_name_and_replaced(view) -> None:
    T = np.eye(4)
    T[:3, 3] = [0.1, 0.2, 0.3]
    view.set_mesh("box", BOX_V, BOX_F, (1, 0, 0), transform=T)
    view.set_points("cloud", np.zeros((10, 3)), np.ones((10, 3)) * 255)
    view.set_frame("ee", T, size=0.05)
    view.set_polyline("path", np.zeros((4, 3)))
    items = view.items()
    assert {n: i.kind for n, i in items.items()} == {
        "box": "mesh",
        "cloud": "points",
        "ee": "frame",
        "path": "line",
    }
    assert items["box"].data["color"] == (1.0, 0.0, 0.0, 1.0)
    assert np.allclose(items["box"].data["transform"], T)
    assert np.allclose(items["cloud"].data["colors"][:, :3], 1.0)  # uint8 colours scaled
    view.set_points("cloud", np.ones((3, 3)))
    assert view.items()["cloud"].data["xyz"].shape == (3, 3)
    view.remove("cloud")
    assert "cloud" not in view.items()
    view.clear()
    assert view.items() == {}


def test_bad_input_raises_naming_item(view) -> None:
    with pytest.raises(ValueError, match="mesh 'm': face index out of range"):
        view.set_mesh("m", BOX_V, BOX_F + 8)
    with pytest.raises(ValueError, match="mesh 'm': vertices must be"):
        view.set_mesh("m", BOX_V[:, :2], BOX_F)
    with pytest.raises(ValueError, match="4x4"):
        view.set_frame("f", np.eye(3))
    with pytest.raises(ValueError, match="points 'p': 5 points but 4 colours"):
        view.set_points("p", np.zeros((5, 3)), np.zeros((4, 3)))
    assert view.items() == {}


def test_without_opengl_shows_message_and_lists_scene(view) -> None:
    if view.has_gl:
        pytest.skip("this Qt platform has OpenGL; the fallback is not used")
    assert view.message.isVisible()
    assert "3D view unavailable" in view.message.text()
    assert "OpenGL" in view.message.text()
    view.set_frame("ee", np.eye(4))
    assert "ee (frame)" in view.message.text()
    img = view.grab_image()
    assert not img.isNull() and img.width() > 100
