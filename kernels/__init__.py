"""Triton kernels for gradient compression and low precision, each with a pure-torch
reference. Depends on nothing in the project but torch and Triton."""
