from __future__ import annotations

import pytest

from twins.errors import TwinError
from twins.params import Param, ParamSet


def test_param_validation_names_the_parameter() -> None:
    p = Param("objects.puck.friction", "1", 0.5, 0.0, 2.0)
    assert p.check(1.2) == 1.2
    with pytest.raises(TwinError, match="objects.puck.friction.*outside its bounds"):
        p.check(2.5)
    with pytest.raises(TwinError, match="objects.puck.friction.*not finite"):
        p.check(float("nan"))
    with pytest.raises(TwinError, match="nominal"):
        Param("objects.puck.mass", "kg", 5.0, 0.0, 1.0)
    with pytest.raises(TwinError, match="lognormal prior needs low > 0"):
        Param("objects.puck.mass", "kg", 0.5, 0.0, 1.0, "lognormal")
    with pytest.raises(TwinError, match="dotted"):
        Param("mass", "kg", 0.5, 0.1, 1.0)


def test_paramset_validate_fills_nominals_and_refuses_unknowns() -> None:
    ps = ParamSet(
        [
            Param("sim.time_step", "s", 0.004, 1e-4, 0.02),
            Param("sim.substeps", "1", 1, 1, 20, integer=True),
        ]
    )
    vals = ps.validate({"sim.substeps": 3.4})
    assert vals == {"sim.time_step": 0.004, "sim.substeps": 3.0}
    with pytest.raises(TwinError, match="unknown parameter 'sim.timestep'"):
        ps.validate({"sim.timestep": 0.01})
    with pytest.raises(TwinError, match="defined twice"):
        ParamSet([ps["sim.time_step"], ps["sim.time_step"]])
    assert ParamSet.from_json(ps.to_json()) == ps
    moved = ps.with_nominals({"sim.time_step": 0.001})
    assert moved["sim.time_step"].nominal == 0.001 and ps["sim.time_step"].nominal == 0.004
