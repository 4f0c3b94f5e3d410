"""The one pose convention of Twinbench.

A pose is either a 4x4 homogeneous matrix `T_a_b` (maps points in frame b to frame a:
`p_a = T_a_b @ p_b`) or a 7-vector `(x, y, z, qx, qy, qz, qw)` — position in metres and a
unit quaternion in **xyzw** order (PyBullet's and SciPy's order; MuJoCo uses wxyz, convert at
its border). Every package uses these helpers instead of its own.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.spatial.transform import Rotation

POSE_UNIT = "xyz_m+quat_xyzw"


def pose_to_matrix(pose: ArrayLike) -> NDArray[np.float64]:
    """(7,) xyz + quat xyzw -> (4, 4) homogeneous transform."""
    p = np.asarray(pose, dtype=float)
    T = np.eye(4)
    T[:3, :3] = Rotation.from_quat(p[3:7]).as_matrix()
    T[:3, 3] = p[:3]
    return T


def matrix_to_pose(T: ArrayLike) -> NDArray[np.float64]:
    """(4, 4) homogeneous transform -> (7,) xyz + quat xyzw (qw >= 0)."""
    M = np.asarray(T, dtype=float)
    q = Rotation.from_matrix(M[:3, :3]).as_quat()
    if q[3] < 0:
        q = -q
    return np.concatenate([M[:3, 3], q])


def quat_wxyz_to_xyzw(q: ArrayLike) -> NDArray[np.float64]:
    """MuJoCo order (w, x, y, z) -> our order (x, y, z, w)."""
    a = np.asarray(q, dtype=float)
    return np.concatenate([a[..., 1:4], a[..., :1]], axis=-1)


def quat_xyzw_to_wxyz(q: ArrayLike) -> NDArray[np.float64]:
    """Our order (x, y, z, w) -> MuJoCo order (w, x, y, z)."""
    a = np.asarray(q, dtype=float)
    return np.concatenate([a[..., 3:4], a[..., :3]], axis=-1)


def invert(T: ArrayLike) -> NDArray[np.float64]:
    """Inverse of a rigid transform, without a general matrix inverse."""
    M = np.asarray(T, dtype=float)
    R = M[:3, :3]
    out = np.eye(4)
    out[:3, :3] = R.T
    out[:3, 3] = -R.T @ M[:3, 3]
    return out


def rotation_angle_deg(R_a: ArrayLike, R_b: ArrayLike) -> float:
    """Angle in degrees of the rotation taking R_b to R_a (3x3 or 4x4 inputs)."""
    A = np.asarray(R_a, dtype=float)[:3, :3]
    B = np.asarray(R_b, dtype=float)[:3, :3]
    return float(np.degrees(Rotation.from_matrix(A @ B.T).magnitude()))


def drop_spin(pose: ArrayLike, axis: ArrayLike = (0.0, 0.0, 1.0)) -> NDArray[np.float64]:
    """A (7,) pose without its rotation about the body's own `axis` (swing-twist split,
    q = swing * twist): the pose of a body symmetric about that axis (a cylinder about
    its z) as a camera can tell it, whatever spin it has. Used alike by the twin's and the
    robot's observation of such an object. qw >= 0."""
    p = np.array(pose, dtype=float)
    q = p[3:7] / np.linalg.norm(p[3:7])
    d = np.asarray(axis, dtype=float)
    d = d / np.linalg.norm(d)
    proj = float(q[:3] @ d) * d
    twist = np.array([*proj, q[3]])
    n = float(np.linalg.norm(twist))
    if n < 1e-9:  # a half turn about an axis normal to `axis`: no twist to remove
        out = q
    else:
        tw = twist / n
        tx, ty, tz, tw_ = -tw[0], -tw[1], -tw[2], tw[3]  # conjugate
        x, y, z, w = q
        out = np.array(
            [
                w * tx + x * tw_ + y * tz - z * ty,
                w * ty - x * tz + y * tw_ + z * tx,
                w * tz + x * ty - y * tx + z * tw_,
                w * tw_ - x * tx - y * ty - z * tz,
            ]
        )
    if out[3] < 0:
        out = -out
    p[3:7] = out
    return p
