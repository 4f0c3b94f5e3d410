"""The ChArUco calibration board of the lab: texture, OpenCV board object, scene geometry.

The board is a printed sheet (visual only, no physics) lying on the table top. Detection
code builds the same `cv2.aruco.CharucoBoard` from the `BoardConfig` with `charuco_board()`
and compares its pose estimate with the truth `BoardConfig.pose` (T_world_board).
"""

from __future__ import annotations

import functools

import cv2
import mujoco
import numpy as np
from numpy.typing import NDArray

from devices.lab.config import BoardConfig, LabError, Pose
from devices.poses import matrix_to_pose, pose_to_matrix, quat_xyzw_to_wxyz

PX_PER_M = 5000  # texture resolution: 5 px per mm
PRINT_LIFT = 0.0005  # the sheet's surface above the table top, m


def charuco_board(b: BoardConfig) -> cv2.aruco.CharucoBoard:
    """The OpenCV board object with this layout (same ids, same object points)."""
    try:
        dict_id = getattr(cv2.aruco, b.dictionary)
    except AttributeError:
        raise LabError(f"lab board: unknown ArUco dictionary {b.dictionary!r}") from None
    d = cv2.aruco.getPredefinedDictionary(dict_id)
    return cv2.aruco.CharucoBoard(tuple(b.squares), b.square_length, b.marker_length, d)


@functools.lru_cache(maxsize=4)
def _texture(b: BoardConfig) -> NDArray[np.uint8]:
    w = round(b.squares[0] * b.square_length * PX_PER_M)
    h = round(b.squares[1] * b.square_length * PX_PER_M)
    m = round(b.margin * PX_PER_M)
    img = charuco_board(b).generateImage((w, h), marginSize=0)
    img = cv2.copyMakeBorder(img, m, m, m, m, cv2.BORDER_CONSTANT, value=255)
    return np.ascontiguousarray(np.repeat(img[:, :, None], 3, axis=2))


def add_board(spec: mujoco.MjSpec, b: BoardConfig) -> None:
    """Add the printed board (textured quad) to the world of `spec`."""
    img = _texture(b)
    h, w = img.shape[:2]
    tex = spec.add_texture(
        name="charuco", type=mujoco.mjtTexture.mjTEXTURE_2D, width=w, height=h, nchannel=3
    )
    tex.data = img.tobytes()
    mat = spec.add_material(name="charuco")
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "charuco"
    mat.specular, mat.shininess = 0.0, 0.0
    W = b.squares[0] * b.square_length
    H = b.squares[1] * b.square_length
    x0, x1, y0, y1 = -b.margin, W + b.margin, -b.margin, H + b.margin
    verts = np.array([[x0, y0, 0], [x1, y0, 0], [x1, y1, 0], [x0, y1, 0]], float)
    # u along the image columns, v along its rows (row 0 = v 0); checked by detection.
    uv = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    mesh = spec.add_mesh(name="charuco")
    mesh.inertia = mujoco.mjtMeshInertia.mjMESH_INERTIA_SHELL  # a flat sheet has no volume
    mesh.uservert = verts.ravel()
    mesh.usertexcoord = uv.ravel()
    mesh.userface = [0, 2, 1, 0, 3, 2]  # facing -z_board: up, out of the table
    mesh.userfacetexcoord = [0, 2, 1, 0, 3, 2]
    T = pose_to_matrix(b.pose)
    p = matrix_to_pose(T)
    spec.worldbody.add_geom(
        name="charuco",
        type=mujoco.mjtGeom.mjGEOM_MESH,
        meshname="charuco",
        material="charuco",
        pos=p[:3],
        quat=quat_xyzw_to_wxyz(p[3:]),
        contype=0,
        conaffinity=0,
        group=1,
    )


def default_board_pose(
    center_xy: tuple[float, float],
    b_squares: tuple[int, int] = (7, 5),
    square: float = 0.04,
    yaw_deg: float = 0.0,
) -> Pose:
    """T_world_board for a board lying face up centred at `center_xy` on the table."""
    from scipy.spatial.transform import Rotation

    R = Rotation.from_euler("z", yaw_deg, degrees=True).as_matrix() @ np.diag([1, -1, -1])
    c = np.array([b_squares[0] * square / 2, b_squares[1] * square / 2, 0.0])
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = np.array([*center_xy, PRINT_LIFT]) - R @ c
    return tuple(float(v) for v in matrix_to_pose(T))  # type: ignore[return-value]
