"""Robots: the wire protocol, the client the workbench uses, the robot-side agent, drivers."""
