"""What both ends of the robot link share: the spec (PROTOCOL.md), the framing and message
checks (`protocol.py`), challenge-response tokens (`auth.py`), pinned TLS (`tls.py`), the
policy spec and observation builder (`policy_spec.py`) and the robot's info and state
(`robot_types.py`). Nothing here imports either side."""
