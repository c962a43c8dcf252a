"""Host side: tensors, partitions and ownership, kernels, device ops and their launch."""
