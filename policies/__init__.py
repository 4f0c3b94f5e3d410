"""Policies: tasks over a twin, randomization, trainers, ONNX policies, evaluation.

tasks/ (TASKS registry: reach, push; Gymnasium envs over a twin, observing through the
agent's PolicySpec and observation builder, devices/robots/wire/policy_spec.py) · randomization.py
(hand-set, posterior, sensor noise/latency/dropouts) · primitives.py (motion primitives +
CEM) · ppo.py (stable-baselines3 PPO) · train.py (train -> export -> check) · export.py
(torch -> ONNX) · policy.py (Policy: ONNX + spec + record) · rollouts.py (episodes as
executor jobs) · evaluate.py (success rate, Wilson interval). torch lives here only.
"""
