"""The experiments: each module has `run(ctx) -> Result`."""
