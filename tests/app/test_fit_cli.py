"""CLI round trip: import a rig twin and recordings through a column mapping, fit, apply
(a new twin version whose parent is the fitted one), export; bad input exits non-zero
with a message naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from devices.trajectory import Trajectory
from resources import shared_data
from resources.project import Project
from twins.rigs import qube_twin
from twins.simulate import replay
from twins.spec import TwinSpec

QUBE = shared_data("real", "furuta_pendulum")
TRUE_R = 11.0


def _qube_csv(folder: Path, name: str, seconds: float, seed: int) -> Path:
    """A Qube chirp simulated with resistance 11 ohm, written as a lab's CSV in degrees."""
    t = np.arange(0, seconds, 0.004)
    V = 2.0 * np.sin(2 * np.pi * (0.5 + (1.0 + 0.3 * seed) * t) * t)
    meta = {"joint_names": ["arm", "pendulum"], "command_joints": ["arm"]}
    cmd = Trajectory(
        t,
        {"robot/command": V[:, None], "robot/joint_pos": np.zeros((len(t), 2))},
        {"robot/command": "V", "robot/joint_pos": "rad"},
        meta=meta,
    )
    sim = replay(qube_twin(), {"robot.actuators.arm.resistance": TRUE_R}, cmd)
    q, qd = np.degrees(sim["robot/joint_pos"]), np.degrees(sim["robot/joint_vel"])
    f = folder / name
    rows = ["stamp_ms,theta_deg,alpha_deg,dtheta_degps,dalpha_degps,volts"]
    rows += [
        f"{1000 * t[i]:.3f},{q[i, 0]:.6f},{q[i, 1]:.6f},{qd[i, 0]:.5f},{qd[i, 1]:.5f},{V[i]:.6f}"
        for i in range(len(t))
    ]
    f.write_text("\n".join(rows) + "\n")
    return f


MAPPING = {
    "format": "twinbench-mapping",
    "time": {"column": "stamp_ms", "unit": "ms"},
    "joint_names": ["arm", "pendulum"],
    "command_joints": ["arm"],
    "channels": {
        "robot/joint_pos": {"columns": ["theta_deg", "alpha_deg"], "unit": "deg"},
        "robot/joint_vel": {"columns": ["dtheta_degps", "dalpha_degps"], "unit": "deg/s"},
        "robot/command": {"columns": ["volts"], "unit": "V"},
    },
}


def _ids(out: str, kind: str) -> list[str]:
    return [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith(kind)]


@pytest.mark.slow
def test_import_fit_apply_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = tmp_path / "proj"
    assert main(["project", "new", str(proj)]) == 0
    assert main(["import", "--project", str(proj), "--rig", "qube_servo2"]) == 0
    twin = _ids(capsys.readouterr().out, "twin")[0]
    mapping = tmp_path / "lab.json"
    mapping.write_text(json.dumps(MAPPING))
    files = [_qube_csv(tmp_path, f"run{i}.csv", 1.0, i) for i in range(2)]
    args = ["import", "--project", str(proj), *map(str, files), "--mapping", str(mapping)]
    assert main([*args, "--twin", twin]) == 0
    train, held = _ids(capsys.readouterr().out, "trajectory")
    rc = main(
        [
            "fit", "--project", str(proj), "--twin", twin, "--trajectories", train,
            "--validation", held, "--params", "robot.actuators.arm.resistance",
            "--window", "0.5", "--budget", "24", "--polish", "2", "--apply", "--quiet",
            "--bounds", "robot.actuators.arm.resistance=4:20",
            "--posterior", "smc", "--particles", "16",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    p = Project.open(proj)
    fit_art = p.artifacts("fit")[-1]
    assert set(fit_art.inputs) == {twin, train, held}
    d = json.loads((p.path_of(fit_art.id) / "fit.json").read_text())
    est = d["estimate"]["robot.actuators.arm.resistance"]
    assert est == pytest.approx(TRUE_R, rel=0.03)
    lo, hi = d["posterior"]["params"]["robot.actuators.arm.resistance"]["interval90"]
    # sampled by SMC (16 particles); these recordings are noise-free, so it collapses there
    assert lo <= est <= hi and hi - lo < 1e-3 * TRUE_R and abs(est - TRUE_R) < 1e-3 * TRUE_R
    assert d["posterior"]["method"] == "smc-abc"
    assert any(n.startswith("posterior: SMC, 16 particles") for n in d["notes"])
    assert (
        d["validation_rmse_after"]["robot/joint_pos"]
        < 0.2 * d["validation_rmse_before"]["robot/joint_pos"]
    )
    assert d["history"] and d["status"] == "done"
    assert (p.path_of(fit_art.id) / "samples.npz").is_file()
    new_twin = p.artifacts("twin")[-1]
    assert new_twin.parent == twin and fit_art.id in new_twin.inputs and train in new_twin.inputs
    spec = TwinSpec.load(p.path_of(new_twin.id))
    assert spec.params["robot.actuators.arm.resistance"].nominal == pytest.approx(est)
    assert "applied" in out and "validation rmse robot/joint_pos" in out
    # the two twin versions side by side on the held-out recording
    rc = main(
        ["fit", "--project", str(proj), "--compare", twin, new_twin.id, "--trajectories", held]
    )
    table = capsys.readouterr().out.splitlines()
    # one table: a row per twin version, a column per recording (and all) and channel
    assert rc == 0 and table[1].split() == [
        "twin",
        "parent",
        f"{held}:robot/joint_pos",
        "all:robot/joint_pos",
    ]
    old_row, new_row = table[3].split(), table[4].split()
    assert old_row[:2] == [twin, "-"] and new_row[:2] == [new_twin.id, twin]
    before, after = float(old_row[2]), float(new_row[2])
    assert after < 0.2 * before and float(new_row[3]) == pytest.approx(after, rel=1e-3)
    # export the imported recording and read it back with the bundled LeRobot mapping
    pq = tmp_path / "ep.parquet"
    assert main(["export", "--project", str(proj), "--trajectory", train, "--out", str(pq)]) == 0
    import pyarrow.parquet as pqm

    table = pqm.read_table(pq)
    assert table.column("observation.state").to_pylist()[0] == pytest.approx(
        np.radians([float(x) for x in files[0].read_text().splitlines()[1].split(",")[1:3]]),
        abs=1e-5,
    )


@pytest.mark.skipif(not QUBE.is_dir(), reason="shared real data not present")
def test_shared_recordings_import_by_bundled_mapping_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    main(["import", "--project", str(proj), "--rig", "qube_servo2"])
    twin = _ids(capsys.readouterr().out, "twin")[0]
    f = sorted((QUBE / "qq_chrip_10to0Hz_p1.5V_250Hz_10s").glob("*.npz"))[0]
    rc = main(
        ["import", "--project", str(proj), str(f), "--mapping", "furuta_pendulum", "--twin", twin]
    )
    assert rc == 0
    tid = _ids(capsys.readouterr().out, "trajectory")[0]
    traj = Trajectory.load(Project.open(proj).path_of(tid))
    assert traj["robot/joint_pos"].shape == (2501, 2) and traj.units["robot/command"] == "V"


def test_bad_input_exits_with_the_file_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    main(["import", "--project", str(proj), "--rig", "qube_servo2"])
    twin = _ids(capsys.readouterr().out, "twin")[0]
    mapping = tmp_path / "lab.json"
    mapping.write_text(json.dumps(MAPPING))
    f = _qube_csv(tmp_path, "run.csv", 0.3, 0)
    # degrees declared as radians
    wrong = json.loads(json.dumps(MAPPING))
    wrong["channels"]["robot/joint_pos"]["unit"] = "rad"
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    rc = main(["import", "--project", str(proj), str(f), "--mapping", str(tmp_path / "wrong.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "run.csv" in err and "degrees" in err
    # a recording from another robot than the twin
    pend = tmp_path / "pend.csv"
    pend.write_text(
        "time,position,velocity,torque\n" + "".join(f"{i / 100},0,0,0\n" for i in range(20))
    )
    rc = main(
        [
            "import", "--project", str(proj), str(pend), "--twin", twin,
            "--mapping", "simple_pendulum",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "pend.csv" in err and "another robot" in err
    # nothing was written by the refused imports
    assert Project.open(proj).artifacts("trajectory") == []
    # an unknown parameter is named
    main(["import", "--project", str(proj), str(f), "--mapping", str(mapping)])
    tid = _ids(capsys.readouterr().out, "trajectory")[0]
    rc = main(["fit", "--project", str(proj), "--trajectories", tid, "--params", "robot.arm.mass"])
    assert rc == 2 and "robot.arm.mass" in capsys.readouterr().err


def test_a_cancelled_fit_is_saved_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.workflows.fit import fit_job, fit_summary
    from twins.fit import FitConfig

    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    main(["import", "--project", str(proj), "--rig", "qube_servo2"])
    mapping = tmp_path / "lab.json"
    mapping.write_text(json.dumps(MAPPING))
    main(
        [
            "import",
            "--project",
            str(proj),
            str(_qube_csv(tmp_path, "r.csv", 0.6, 0)),
            "--mapping",
            str(mapping),
        ]
    )
    tid = _ids(capsys.readouterr().out, "trajectory")[0]
    p = Project.open(proj)
    cfg = FitConfig(
        params=("robot.actuators.arm.resistance",), window_s=None, budget=18, popsize=6,
        polish_rounds=1, validation=0.0,
    )  # fmt: skip
    job = fit_job(p, None, [tid], cfg)
    for rec in job:
        if isinstance(rec.partial, dict) and rec.partial.get("generation") == 1:
            break
    job.close()  # what the GUI's stop button and Ctrl-C do
    cancelled = p.artifacts("fit")[-1]
    d = fit_summary(p, cancelled.id)
    assert d["status"] == "cancelled" and d["checkpoint"]["evals"] == 6
    job = fit_job(p, None, [tid], cfg, resume_from=cancelled.id)
    try:
        while True:
            next(job)
    except StopIteration as stop:
        done = stop.value
    d = fit_summary(p, done)
    assert d["status"] == "done" and d["evaluations"] >= 18
    assert d["estimate"]["robot.actuators.arm.resistance"] == pytest.approx(TRUE_R, rel=0.05)


def _qube_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str, str]:
    """A project with the Qube rig twin and one imported 0.6 s chirp: (folder, twin, rec)."""
    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    main(["import", "--project", str(proj), "--rig", "qube_servo2"])
    twin = _ids(capsys.readouterr().out, "twin")[0]
    mapping = tmp_path / "lab.json"
    mapping.write_text(json.dumps(MAPPING))
    csv = _qube_csv(tmp_path, "r.csv", 0.6, 0)
    assert main(["import", "--project", str(proj), str(csv), "--mapping", str(mapping)]) == 0
    return proj, twin, _ids(capsys.readouterr().out, "trajectory")[0]


def _fit_argv(proj: Path, twin: str, rec: str) -> list[str]:
    return [
        "fit", "--project", str(proj), "--twin", twin, "--trajectories", rec,
        "--params", "robot.actuators.arm.resistance", "--window", "0", "--budget", "12",
        "--polish", "1", "--apply", "--quiet",
    ]  # fmt: skip


def test_a_fit_whose_replays_all_fail_exits_non_zero_and_applies_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replay fails: the fit is an error naming how many failed and why; no fit
    artifact (not even a cancelled checkpoint) and, despite --apply, no new twin."""
    import twins.fit.objective as objective
    from twins.errors import TwinError

    proj, twin, rec = _qube_project(tmp_path, capsys)

    def explode(*_: object, **__: object) -> object:
        raise TwinError("the twin exploded in the replay")

    monkeypatch.setattr(objective, "_replay_window", explode)
    rc = main(_fit_argv(proj, twin, rec))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    failed, of = err.split(" replays failed")[0].split(": ")[-1].split(" of ")
    assert int(failed) == int(of) > 0, err
    assert "TwinError: the twin exploded in the replay" in err and "nothing saved" in err
    p = Project.open(proj)
    assert p.artifacts("fit") == []
    assert [a.id for a in p.artifacts("twin")] == [twin]


def test_a_fit_whose_replays_mostly_fail_exits_non_zero_and_applies_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start replays, every later candidate fails: the fit runs to its end and is
    judged before it is saved (more than half of its replays failed): exit 2, no fit, no
    twin. Without the failures the same fit is saved and applied."""
    import twins.fit.objective as objective
    from twins.errors import TwinError

    proj, twin, rec = _qube_project(tmp_path, capsys)
    real = objective._replay_window
    calls = {"n": 0}

    def flaky(worlds: object, values: object, w: object) -> object:
        calls["n"] += 1
        if calls["n"] > 1:  # the start's one window replays, nothing after it
            raise TwinError(f"unstable contact at candidate {calls['n']}")
        return real(worlds, values, w)  # type: ignore[arg-type]

    monkeypatch.setattr(objective, "_replay_window", flaky)
    rc = main(_fit_argv(proj, twin, rec))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert re.search(r"\d+ of \d+ replays failed: TwinError: unstable contact", err), err
    p = Project.open(proj)
    assert p.artifacts("fit") == [] and [a.id for a in p.artifacts("twin")] == [twin]
    monkeypatch.setattr(objective, "_replay_window", real)
    assert main(_fit_argv(proj, twin, rec)) == 0, capsys.readouterr()
    p.refresh()
    assert len(p.artifacts("fit")) == 1 and len(p.artifacts("twin")) == 2


def test_import_refuses_commands_the_twin_cannot_take_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording of torque commands matched to a twin whose arm is driven by voltage (the
    Qube's DC motor; a position-servo arm is refused the same way, tests/twins/test_fit.py)
    is refused at import, naming the file, the twin and both sides; nothing is written.
    A fit of such a recording imported without a twin is refused before any replay."""
    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    main(["import", "--project", str(proj), "--rig", "qube_servo2"])
    twin = _ids(capsys.readouterr().out, "twin")[0]
    torque = json.loads(json.dumps(MAPPING))
    torque["channels"]["robot/command"]["unit"] = "N*m"
    torque["meta"] = {"command_mode": "torque"}
    mapping = tmp_path / "torque.json"
    mapping.write_text(json.dumps(torque))
    f = _qube_csv(tmp_path, "torque_run.csv", 0.3, 0)
    args = ["import", "--project", str(proj), str(f), "--mapping", str(mapping)]
    rc = main([*args, "--twin", twin])
    err = capsys.readouterr().err
    assert rc == 2
    assert "recording 'torque_run.csv' commands torques (N*m" in err and f"twin '{twin}'" in err
    assert "DC motors" in err and "'dc_motor' actuators take V" in err
    assert Project.open(proj).artifacts("trajectory") == []
    assert main(args) == 0  # without a twin: imported as it is
    tid = _ids(capsys.readouterr().out, "trajectory")[0]
    rc = main(["fit", "--project", str(proj), "--trajectories", tid, "--params",
               "robot.actuators.arm.resistance", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and f"recording '{tid}' commands torques" in err and twin in err
    assert Project.open(proj).artifacts("fit") == []


def test_an_object_only_fit_without_channels_says_which_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An object-only recording (no robot channels) fitted with the default channel
    (robot/joint_pos): the error names the recording and says to pass --channels with its
    object pose channels; nothing is saved. With them, the fit runs."""
    from devices.poses import POSE_UNIT
    from twins.make import assemble, primitive_object

    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    p = Project.open(proj)
    rest = {"box": (0.3, -0.2, 0.025, 0, 0, 0, 1), "ball": (0.3, 0.3, 0.03, 0, 0, 0, 1)}
    box = primitive_object("box", "box", (0.04, 0.025, 0.025), rest["box"], mass=0.25)
    ball = primitive_object("ball", "sphere", (0.03,), rest["ball"], mass=0.1)
    with p.new_artifact("twin", summary="two objects") as folder:
        assemble("tabletop", objects=[box, ball]).save(folder)
    twin = p.artifacts("twin")[-1].id
    t = np.arange(0, 0.3, 1 / 60)
    chans = {
        f"objects/{n}/pose": np.tile(np.asarray(v, float), (len(t), 1)) for n, v in rest.items()
    }
    chans["objects/box/track_quality"] = np.ones((len(t), 1))
    units = {k: POSE_UNIT for k in chans} | {"objects/box/track_quality": "1"}
    with p.new_artifact("trajectory", summary="objects at rest") as folder:
        Trajectory(t, chans, units, "real").save(folder)
    rec = p.artifacts("trajectory")[-1].id
    argv = ["fit", "--project", str(proj), "--twin", twin, "--trajectories", rec,
            "--params", "objects.box.friction", "--window", "0", "--budget", "6", "--polish",
            "0", "--quiet"]  # fmt: skip
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and f"recording {rec}" in err and "robot/joint_pos" in err
    assert "--channels objects/box/pose=1 objects/ball/pose=1" in err, err
    assert "track_quality" not in err.split("--channels")[1]
    p.refresh()
    assert p.artifacts("fit") == []
    assert main([*argv, "--channels", "objects/box/pose=1", "objects/ball/pose=1"]) == 0


ONE_JOINT = """<?xml version="1.0"?>
<robot name="one">
  <link name="base"><inertial><mass value="2"/>
    <inertia ixx="1e-2" ixy="0" ixz="0" iyy="1e-2" iyz="0" izz="1e-2"/></inertial></link>
  <link name="arm"><inertial><origin xyz="0.1 0 0"/><mass value="0.5"/>
    <inertia ixx="1e-3" ixy="0" ixz="0" iyy="1e-3" iyz="0" izz="1e-3"/></inertial></link>
  <joint name="j1" type="revolute"><parent link="base"/><child link="arm"/>
    <axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="5" velocity="3"/></joint>
</robot>
"""


def _one_joint_project(tmp_path: Path) -> tuple[Path, str]:
    """A project with the twin of a one-joint arm (a position servo, limits +-1 rad)."""
    from twins.from_scan import robot_into
    from twins.make import assemble

    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    urdf = tmp_path / "one.urdf"
    urdf.write_text(ONE_JOINT)
    p = Project.open(proj)
    with p.new_artifact("twin", summary="one joint") as folder:
        robot, params, _ = robot_into(folder, str(urdf))
        assemble("one", (robot, params), ground=False, base_dir=folder).save(folder)
    return proj, p.artifacts("twin")[-1].id


def test_import_and_fit_warn_of_joint_positions_outside_the_twins_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording that takes j1 to 1.3 rad (limit 1 rad): imported, with a warning naming
    the joint, how far and the file; the fit notes the same and still runs."""
    proj, twin = _one_joint_project(tmp_path)
    t = np.arange(0, 0.6, 0.01)
    q = 1.3 * np.sin(np.pi * t / 0.6)
    f = tmp_path / "wide.csv"
    f.write_text(
        "t,q,cmd\n" + "".join(f"{a:.3f},{b:.6f},{b:.6f}\n" for a, b in zip(t, q, strict=True))
    )
    mapping = tmp_path / "one.json"
    mapping.write_text(json.dumps({
        "format": "twinbench-mapping", "time": {"column": "t", "unit": "s"},
        "joint_names": ["j1"], "command_joints": ["j1"],
        "channels": {"robot/joint_pos": {"columns": ["q"], "unit": "rad"},
                     "robot/command": {"columns": ["cmd"], "unit": "rad"}},
    }))  # fmt: skip
    rc = main(["import", "--project", str(proj), str(f), "--mapping", str(mapping), "--twin", twin])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "warning: recording 'wide.csv': joint 'j1' goes 0.3 rad past its upper limit" in err
    assert f"twin '{twin}'" in err and "outside the twin's limits" in out
    rec = _ids(out, "trajectory")[0]
    rc = main(["fit", "--project", str(proj), "--twin", twin, "--trajectories", rec,
               "--params", "robot.actuators.j1.bandwidth", "--window", "0", "--budget", "6",
               "--polish", "0", "--quiet"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    # the recording by its own name (the file's stem), as the fit's other notes name it
    assert "note: recording 'wide': joint 'j1' goes 0.3 rad past its upper limit" in out


CUBES = shared_data("real", "cube_tosses")


@pytest.mark.skipif(not (CUBES / "toss_000.csv").is_file(), reason="shared real data not present")
def test_real_cube_tosses_fit_their_contact_pair_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = tmp_path / "proj"
    main(["project", "new", str(proj)])
    assert main(["import", "--project", str(proj), "--rig", "cube_toss"]) == 0
    twin = _ids(capsys.readouterr().out, "twin")[0]
    files = [str(CUBES / f"toss_{i:03d}.csv") for i in (0, 40, 80)]
    assert main(["import", "--project", str(proj), *files, "--mapping", "cube_tosses"]) == 0
    recs = _ids(capsys.readouterr().out, "trajectory")
    assert len(recs) == 3
    mu, e = "contacts.cube.ground.friction", "contacts.cube.ground.restitution"
    args = ["fit", "--project", str(proj), "--twin", twin, "--trajectories", *recs]
    args += ["--params", mu, e, "--channels", "objects/cube/pose=1", "--window", "0"]
    args += ["--pose-rotation", "gyration", "--global", "8", "--budget", "8", "--polish", "0"]
    assert main([*args, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "latency not fitted" not in out  # no robot, no latency
    pos = re.search(r"train rmse objects/cube/position: ([\d.]+) -> ([\d.]+)", out)
    assert pos is not None, out
    assert float(pos.group(2)) < 0.5 * float(pos.group(1))  # metres, from mu 0.5 and e 0.1
    assert re.search(r"train rmse objects/cube/orientation: [\d.]+ -> [\d.]+", out)
    fitted = re.search(rf"{re.escape(mu)}\s+0.5 -> ([\d.]+)", out)
    assert fitted is not None and 0.1 < float(fitted.group(1)) < 0.3, out
