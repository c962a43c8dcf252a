"""The in-kernel language: parameter annotations, `Tile`, and the builtins a kernel calls."""
