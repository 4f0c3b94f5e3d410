"""The robot side: what runs on the robot's computer (or as the virtual lab's process).
`serve.py` is its entry point (`python -m devices.robots.agent.serve`, `python main.py
agent serve` / `lab serve`), `launch.py` starts it as a subprocess; `control.Agent` runs
commands and policies inside the envelope (`safety.py`, `safety_config.py`) under the
watchdog, `server.py` + `session.py` speak the protocol, `drivers/` move the joints. Nothing
here imports the workbench side (devices/robots/*.py); both ends share devices/robots/wire/.
"""
