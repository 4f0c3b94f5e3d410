"""One module per CLI command (see app/cli.py)."""
