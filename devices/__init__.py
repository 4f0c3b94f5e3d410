"""Value types of the world (RGBDFrame, Trajectory), cameras, robots and the virtual lab."""
