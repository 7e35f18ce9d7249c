"""Kernels: Triton on CUDA tensors, plain-torch references (reference.py) everywhere else."""
