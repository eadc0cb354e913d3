"""Replication over pysyncobj: a typed replicated log per kernel (comes with replicated kernels)."""
