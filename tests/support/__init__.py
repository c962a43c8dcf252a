"""Helpers shared by the test files: kernels with their references, a simulator harness,
stand-ins for the driver. Test files import these, never each other."""
