"""Developer tools run as `python -m cutile_py.tools.<name>`."""
