"""Twin workflow through the CLI and the app layer: lineage, failures leave no trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main as cli
from app.workflows import twin as twin_flow
from resources.jobs import run_to_end
from resources.project import MANIFEST, Project
from twins.errors import TwinError


def test_cli_build_with_lineage_and_info(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "p"
    Project.create(root)
    assert cli(["twin", "build", "--project", str(root), "--procedural", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 objects" in out and "concave" in out
    proj = Project.open(root)
    (twin,) = proj.artifacts("twin")
    (scan,) = proj.artifacts("scan")
    assert twin.inputs == (scan.id,)
    folder = proj.path_of(twin.id)
    for f in ("twin.json", "urdf/scene.urdf", "urdf/u_block.urdf", "objects/u_block_hull0.obj"):
        assert (folder / f).is_file(), f
    assert cli(["twin", "info", "--project", str(root)]) == 0
    assert "objects.u_block.density" in capsys.readouterr().out
    # a second twin from the same scan, no robot
    assert (
        cli(
            [
                "twin",
                "build",
                "--project",
                str(root),
                "--scan",
                scan.id,
                "--robot",
                "none",
                "--quiet",
            ]
        )
        == 0
    )
    assert "no robot" in capsys.readouterr().out


def test_failed_build_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = Project.create(tmp_path / "p")
    scan_id = twin_flow.procedural_scan(proj)
    broken = proj.path_of(scan_id) / "objects" / "box.obj"
    broken.write_text("this is not a mesh\n")
    manifest = (proj.root / MANIFEST).read_text()
    with pytest.raises(TwinError, match="object 'box': mesh is degenerate"):
        run_to_end(twin_flow.build_twin(proj, scan_id))
    assert (proj.root / MANIFEST).read_text() == manifest
    assert not (proj.root / "twins").exists() or not any((proj.root / "twins").iterdir())
    # a bad robot file: the CLI says which file and exits non-zero
    bad = tmp_path / "bad.urdf"
    bad.write_text("<robot name='x'><link name='a'>")
    rc = cli(
        [
            "twin",
            "build",
            "--project",
            str(proj.root),
            "--procedural",
            "--robot",
            str(bad),
            "--quiet",
        ]
    )
    assert rc == 2 and "bad.urdf: malformed URDF XML" in capsys.readouterr().err
    assert (
        json.loads((proj.root / MANIFEST).read_text())["artifacts"]
        == json.loads(manifest)["artifacts"]
    )


def test_edit_is_a_new_artifact_with_parent(tmp_path: Path) -> None:
    proj = Project.create(tmp_path / "p")
    tid = run_to_end(twin_flow.build_twin(proj, None, robot=None, procedural=True))
    session = twin_flow.open_session(proj, tid)
    try:
        session.set_values({"objects.box.friction": 0.9})
        with pytest.raises(TwinError, match="objects.box.friction.*outside its bounds"):
            session.set_values({"objects.box.friction": 7.0})
        assert session.values["objects.box.friction"] == 0.9  # the old world is kept
        session.step(0.5)
        assert session.time == pytest.approx(0.5, abs=0.005)
        new_id = session.save(proj)
    finally:
        session.close()
    art = proj.artifact(new_id)
    assert art.parent == tid and proj.lineage(new_id)[0].id in (tid, art.inputs[0])
    _, spec = twin_flow.load_twin(proj, new_id)
    assert spec.params["objects.box.friction"].nominal == 0.9
    assert spec.meta["parent_twin"] == tid
