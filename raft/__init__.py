"""Replication over pysyncobj: a typed replicated log per kernel (arrives with replicated kernels)."""
