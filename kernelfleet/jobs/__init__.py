"""Background training jobs on the fleet's idle GPUs (docs/jobs.md); `kernelfleet.jobs.sdk` is
what a job's own process imports."""
