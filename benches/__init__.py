"""Benchmark modules; registered in benches/cli.py."""
