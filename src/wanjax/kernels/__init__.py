"""Attention kernels behind ``wanjax.kernels.attention.attention``: one module per backend.

``xla`` (portable, memory-bounded), ``cudnn`` (NVIDIA GPUs), ``splash`` (JAX's Pallas TPU splash
attention) and ``splash_exp2`` (our Pallas TPU kernel with exp2). Every kernel takes ``(B, L, H, D)``
arrays with keys already smoothed and the softmax ``scale`` given explicitly.
"""
