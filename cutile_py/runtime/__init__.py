"""Backends (cuda, interpret; sim to come), device memory, module loading and launches."""
