"""Robots, in three rooms: `agent/` runs on the robot's computer (the agent, its server and
sessions, the safety envelope, watchdog, policy runner, drivers and bus emulators, and the
`serve` / `launch` entry points); `wire/` is what both ends share (the protocol and its
spec PROTOCOL.md, authentication, TLS, the policy spec, the robot's info and state types);
the modules here are the workbench side: the client (`client.py`), planned motions
(`motion.py`, the excitation library `excitation.py`) and the one checked way a motion
reaches the arm (`motion_stream.py`)."""
