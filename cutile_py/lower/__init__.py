"""Lowering from the tile IR to PTX."""
