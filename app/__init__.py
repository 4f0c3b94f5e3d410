"""Qt-free application layer: Project, workflows, job protocol, CLI and benchmarks."""
