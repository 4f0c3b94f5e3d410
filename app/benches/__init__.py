"""Benchmark modules; registered in app/bench.py."""
