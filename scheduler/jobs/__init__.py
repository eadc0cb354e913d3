"""Background training jobs on the GPUs cells leave idle: Gavel's and Shockwave's policies, the
round mechanism that turns their allocations into leases, trace readers and the job simulator.
Pure, like the rest of `kernelfleet.scheduler`: frozen snapshots in, decisions out.
"""
