"""Read, check and repair robot URDFs; export objects and the scene as URDF.

`read_urdf` refuses malformed files with a message naming the file, line and element.
`loadable_urdf` returns a file PyBullet can load: the original when it is fine, else a
repaired copy (meshes resolved, missing meshes replaced by inertia-equivalent boxes or
dropped from collision, degenerate limits removed) plus notes saying what was done.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from resources import atomic
from twins.errors import TwinError

MOVABLE = ("revolute", "continuous", "prismatic")


@dataclass(frozen=True)
class UrdfJoint:
    name: str
    kind: str
    parent: str
    child: str
    lower: float | None
    upper: float | None
    effort: float | None
    velocity: float | None
    damping: float
    friction: float


@dataclass(frozen=True)
class UrdfInfo:
    """What Twinbench needs from a URDF: names, masses, joints and mesh references."""

    path: Path
    name: str
    link_masses: dict[str, float]
    joints: tuple[UrdfJoint, ...]
    meshes: tuple[tuple[str, str, str, Path | None], ...]  # (link, visual|collision, ref, file)
    notes: tuple[str, ...] = field(default=())

    @property
    def movable(self) -> tuple[UrdfJoint, ...]:
        return tuple(j for j in self.joints if j.kind in MOVABLE)


def _float(
    el: ET.Element | None, attr: str, where: str, default: float | None = None
) -> float | None:
    if el is None or el.get(attr) is None:
        return default
    try:
        v = float(el.get(attr, ""))
    except ValueError:
        raise TwinError(f"{where}: {attr}='{el.get(attr)}' is not a number") from None
    if not math.isfinite(v):
        raise TwinError(f"{where}: {attr} is not finite")
    return v


def resolve_mesh(ref: str, urdf_dir: Path) -> Path | None:
    """Find a mesh referenced as package://pkg/rel, file://abs, relative or absolute."""
    cands: list[Path] = []
    if ref.startswith("package://"):
        rest = ref[len("package://") :]
        pkg, _, rel = rest.partition("/")
        cands += [
            urdf_dir / rel,
            urdf_dir / pkg / rel,
            urdf_dir.parent / pkg / rel,
            urdf_dir.parent / rel,
        ]
    elif ref.startswith("file://"):
        cands.append(Path(ref[len("file://") :]))
    else:
        p = Path(ref)
        cands.append(p if p.is_absolute() else urdf_dir / p)
    return next((c for c in cands if c.is_file()), None)


def read_urdf(path: Path) -> UrdfInfo:
    """Parse and check a URDF; TwinError names the file and the bad element."""
    path = Path(path)
    if not path.is_file():
        raise TwinError(f"{path}: URDF file not found")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise TwinError(f"{path}: malformed URDF XML ({exc})") from None
    if root.tag != "robot":
        raise TwinError(f"{path}: root element is <{root.tag}>, not <robot>")
    masses: dict[str, float] = {}
    meshes: list[tuple[str, str, str, Path | None]] = []
    for link in root.findall("link"):
        lname = link.get("name")
        if not lname:
            raise TwinError(f"{path}: a <link> has no name")
        m = _float(link.find("inertial/mass"), "value", f"{path}: link '{lname}' mass", 0.0)
        assert m is not None
        if m < 0:
            raise TwinError(f"{path}: link '{lname}' has negative mass {m} kg")
        masses[lname] = m
        for kind in ("visual", "collision"):
            for mesh in link.findall(f"{kind}/geometry/mesh"):
                ref = mesh.get("filename", "")
                meshes.append((lname, kind, ref, resolve_mesh(ref, path.parent)))
    joints = []
    for j in root.findall("joint"):
        jname, kind = j.get("name", ""), j.get("type", "")
        where = f"{path}: joint '{jname}'"
        parent, child = j.find("parent"), j.find("child")
        if parent is None or child is None:
            raise TwinError(f"{where}: needs <parent> and <child>")
        pl, cl = parent.get("link", ""), child.get("link", "")
        for ln in (pl, cl):
            if ln not in masses:
                raise TwinError(f"{where}: refers to unknown link '{ln}'")
        lim, dyn = j.find("limit"), j.find("dynamics")
        lower, upper = _float(lim, "lower", where), _float(lim, "upper", where)
        if kind in MOVABLE and masses[cl] <= 0:
            raise TwinError(
                f"{path}: link '{cl}' moved by joint '{jname}' has mass "
                f"{masses[cl]} kg; a moving link needs a positive mass"
            )
        joints.append(
            UrdfJoint(
                jname,
                kind,
                pl,
                cl,
                lower,
                upper,
                _float(lim, "effort", where),
                _float(lim, "velocity", where),
                _float(dyn, "damping", where, 0.0) or 0.0,
                _float(dyn, "friction", where, 0.0) or 0.0,
            )
        )
    return UrdfInfo(path, root.get("name", path.stem), masses, tuple(joints), tuple(meshes))


def _inertia_box(link: ET.Element) -> tuple[list[float], str, str] | None:
    """Half-size-free box dims with the link's mass and inertia, and its origin."""
    inertial = link.find("inertial")
    if inertial is None or inertial.find("inertia") is None:
        return None
    i = inertial.find("inertia")
    m = float(inertial.find("mass").get("value", "0"))  # type: ignore[union-attr]
    if m <= 0:
        return None
    ixx, iyy, izz = (float(i.get(k, "0")) for k in ("ixx", "iyy", "izz"))  # type: ignore[union-attr]
    dims = [
        math.sqrt(max(6.0 / m * v, 0.0))
        for v in (iyy + izz - ixx, ixx + izz - iyy, ixx + iyy - izz)
    ]
    dims = [max(d, 0.005) for d in dims]
    o = inertial.find("origin")
    return (
        dims,
        (o.get("xyz", "0 0 0") if o is not None else "0 0 0"),
        (o.get("rpy", "0 0 0") if o is not None else "0 0 0"),
    )


def loadable_urdf(path: Path, out_dir: Path | None = None) -> tuple[Path, list[str]]:
    """A URDF PyBullet can load, and notes on what had to be repaired (empty if nothing).

    Missing visual meshes become a box with the link's mass and inertia; missing collision
    meshes are dropped (the link keeps its inertia but collides with nothing); a revolute
    joint with lower >= upper is treated as continuous. The repaired copy goes to `out_dir`
    with the meshes it found copied beside it (self-contained), or by default to a per-file
    cache folder, pointing at the meshes where they are.
    """
    read_urdf(path)  # refuses malformed files first
    root = ET.parse(path).getroot()
    notes: list[str] = []
    changed = False
    copies: dict[Path, str] = {}
    for link in root.findall("link"):
        lname = link.get("name", "")
        for kind in ("visual", "collision"):
            for el in list(link.findall(kind)):
                mesh = el.find("geometry/mesh")
                if mesh is None:
                    continue
                ref = mesh.get("filename", "")
                found = resolve_mesh(ref, path.parent)
                if found is not None:
                    if out_dir is None:  # cache copy: point at the file where it is
                        mesh.set("filename", str(found.resolve()))
                    else:  # twin folder: self-contained, meshes (and .mtl) copied beside
                        rel = f"meshes/{hashlib.sha1(str(found).encode()).hexdigest()[:8]}/{found.name}"
                        copies[found] = rel
                        mesh.set("filename", rel)
                    changed = (
                        changed or ref.startswith(("package://", "file://")) or out_dir is not None
                    )
                    continue
                changed = True
                link.remove(el)
                if kind == "collision":
                    notes.append(
                        f"link '{lname}': collision mesh '{ref}' not found; the link "
                        "keeps its mass and inertia but has no collision shape"
                    )
                    continue
                box = _inertia_box(link)
                if box is None:
                    notes.append(f"link '{lname}': visual mesh '{ref}' not found; not drawn")
                    continue
                dims, xyz, rpy = box
                vis = ET.SubElement(link, "visual")
                ET.SubElement(vis, "origin", xyz=xyz, rpy=rpy)
                geo = ET.SubElement(vis, "geometry")
                ET.SubElement(geo, "box", size=" ".join(f"{d:.4g}" for d in dims))
                notes.append(
                    f"link '{lname}': visual mesh '{ref}' not found; drawn as a "
                    f"{'x'.join(f'{d:.3f}' for d in dims)} m box with its inertia"
                )
    for j in root.findall("joint"):
        lim = j.find("limit")
        if j.get("type") == "revolute" and lim is not None:
            lo, hi = float(lim.get("lower", "0")), float(lim.get("upper", "0"))
            if lo >= hi:
                j.set("type", "continuous")
                notes.append(
                    f"joint '{j.get('name')}': limits lower={lo:g} >= upper={hi:g} "
                    "are not usable; treated as continuous (no limits)"
                )
                changed = True
            for k in ("effort", "velocity"):
                if float(lim.get(k, "1") or 0) <= 0:
                    lim.attrib.pop(k, None)
    if not changed:
        return Path(path), []
    digest = hashlib.sha1(Path(path).read_bytes() + b"v2").hexdigest()[:12]
    out = Path(out_dir) if out_dir else Path(tempfile.gettempdir()) / "twinbench-urdf" / digest
    out.mkdir(parents=True, exist_ok=True)
    for src, rel in copies.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        for f in (src, src.with_suffix(".mtl")):
            if f.is_file() and not (out / rel).parent.joinpath(f.name).exists():
                shutil.copyfile(f, (out / rel).parent / f.name)
    target = out / f"{Path(path).stem}.urdf"
    # atomic: parallel test workers may repair the same file into the same cache folder
    atomic.write_with(
        target, lambda tmp: ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    )
    return target, notes


# -- export -------------------------------------------------------------------------------
def _fmt(v: np.ndarray | list[float] | tuple[float, ...]) -> str:
    return " ".join(f"{float(x):.9g}" for x in v)


def _geometry(kind: str, size: tuple[float, ...], mesh: str | None) -> str:
    if kind == "box":
        return f'<box size="{_fmt([2 * s for s in size])}"/>'
    if kind == "cylinder":
        return f'<cylinder radius="{size[0]:.9g}" length="{size[1]:.9g}"/>'
    if kind == "sphere":
        return f'<sphere radius="{size[0]:.9g}"/>'
    return f'<mesh filename="{mesh}"/>'


def origin_xml(pose: tuple[float, ...] | np.ndarray) -> str:
    from scipy.spatial.transform import Rotation

    rpy = Rotation.from_quat(np.asarray(pose[3:7], float)).as_euler("xyz")
    return f'<origin xyz="{_fmt(pose[:3])}" rpy="{_fmt(rpy)}"/>'


def link_xml(
    name: str,
    kind: str,
    size: tuple[float, ...],
    mesh: str | None,
    hulls: tuple[str, ...],
    mass: float,
    com: tuple[float, ...],
    inertia: np.ndarray,
    rgba: tuple[float, ...],
    collision_pose: tuple[float, ...] = (0, 0, 0, 0, 0, 0, 1),
) -> str:
    """One URDF <link>: visual (the mesh, else the primitive), collision (the primitive,
    or one element per convex hull) and inertial (about `com`)."""
    o = '<origin xyz="0 0 0" rpy="0 0 0"/>'
    co = origin_xml(collision_pose)
    Ib = inertia
    if kind == "mesh":
        col = "".join(
            f"<collision>{o}<geometry>{_geometry('mesh', (), h)}</geometry></collision>"
            for h in hulls
        )
    else:
        col = f"<collision>{co}<geometry>{_geometry(kind, size, None)}</geometry></collision>"
    vis = (
        f"{o}<geometry>{_geometry('mesh', (), mesh)}</geometry>"
        if mesh
        else f"{co}<geometry>{_geometry(kind, size, None)}</geometry>"
    )
    return (
        f'<link name="{name}"><inertial><origin xyz="{_fmt(com)}" rpy="0 0 0"/>'
        f'<mass value="{mass:.9g}"/><inertia ixx="{Ib[0, 0]:.9g}" ixy="{Ib[0, 1]:.9g}" '
        f'ixz="{Ib[0, 2]:.9g}" iyy="{Ib[1, 1]:.9g}" iyz="{Ib[1, 2]:.9g}" izz="{Ib[2, 2]:.9g}"/>'
        f"</inertial><visual>{vis}"
        f'<material name="{name}_mat"><color rgba="{_fmt(rgba)}"/></material></visual>'
        f"{col}</link>"
    )


@dataclass(frozen=True)
class UrdfVisual:
    """One <visual> of a link: geometry kind, size or mesh file, origin in the link frame."""

    link: str
    kind: str  # mesh | box | cylinder | sphere
    size: tuple[float, ...]
    mesh: Path | None
    scale: tuple[float, float, float]
    origin: np.ndarray  # 4x4 T_link_visual
    rgba: tuple[float, float, float, float] | None


def _origin(el: ET.Element | None) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    T = np.eye(4)
    if el is not None:
        T[:3, 3] = [float(x) for x in el.get("xyz", "0 0 0").split()]
        T[:3, :3] = Rotation.from_euler(
            "xyz", [float(x) for x in el.get("rpy", "0 0 0").split()]
        ).as_matrix()
    return T


def visuals(path: Path) -> list[UrdfVisual]:
    """The visual elements of a (loadable) URDF, meshes resolved to files (missing: None)."""
    root = ET.parse(path).getroot()
    colors = {m.get("name"): m.find("color") for m in root.findall("material")}
    out = []
    for link in root.findall("link"):
        for vis in link.findall("visual"):
            geo = vis.find("geometry")
            if geo is None or len(geo) == 0:
                continue
            g = geo[0]
            mat = vis.find("material")
            col = (
                mat.find("color")
                if mat is not None and mat.find("color") is not None
                else colors.get(mat.get("name"))
                if mat is not None
                else None
            )
            rgba = tuple(float(x) for x in col.get("rgba", "").split()) if col is not None else None
            scale = tuple(float(x) for x in g.get("scale", "1 1 1").split())
            size: tuple[float, ...]
            mesh: Path | None
            if g.tag == "mesh":
                kind, size, mesh = (
                    "mesh",
                    (),
                    resolve_mesh(g.get("filename", ""), Path(path).parent),
                )
            elif g.tag == "box":
                kind, size, mesh = (
                    "box",
                    tuple(float(x) for x in g.get("size", "0 0 0").split()),
                    None,
                )
            elif g.tag == "cylinder":
                kind, size, mesh = (
                    "cylinder",
                    (float(g.get("radius", 0)), float(g.get("length", 0))),
                    None,
                )
            elif g.tag == "sphere":
                kind, size, mesh = "sphere", (float(g.get("radius", 0)),), None
            else:
                continue
            out.append(
                UrdfVisual(
                    link.get("name", ""),
                    kind,
                    size,
                    mesh,
                    scale if len(scale) == 3 else (1.0, 1.0, 1.0),  # type: ignore[arg-type]
                    _origin(vis.find("origin")),
                    rgba if rgba and len(rgba) == 4 else None,
                )
            )  # type: ignore[arg-type]
    return out
