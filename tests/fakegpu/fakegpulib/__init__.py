"""Python side of the stand-in GPU driver: the `fakegpu` and `nvidia-smi` commands.

Stdlib only, Python 3.9+: it runs on Debian 12 lab hosts with the system python3.
"""
