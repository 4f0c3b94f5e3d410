"""RGB-D frames -> TSDF mesh, table plane, objects, calibration (Open3D lives here)."""
