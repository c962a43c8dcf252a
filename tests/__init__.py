"""cutile_py's tests (a package, so that pytest puts the repository root on the path and
`tests.support` imports under a plain `pytest`)."""
