#!/bin/sh
# Regenerate the nvcc-made PTX beside its CUDA source (needs nvcc; CI only reads the .ptx).
cd "$(dirname "$0")" && nvcc -arch=sm_80 -ptx -O3 -lineinfo parser_sample.cu -o parser_sample.ptx
