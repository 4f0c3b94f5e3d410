"""Policies: tasks over a twin, trainers, ONNX export, evaluation, deploy (later issues)."""
