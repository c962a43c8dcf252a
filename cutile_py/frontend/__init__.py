"""Frontend: kernel capture, signatures and specialization, AST → tile IR."""
