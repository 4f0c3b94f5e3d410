"""Digital twin: TwinSpec, parameters, PyBullet builder, simulate/replay, fitting."""
