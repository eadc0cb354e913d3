"""Background training jobs on the GPUs cells do not hold (docs/jobs.md).

- `records`: a job, its state machine and admin model; `submission`: a submitted body, checked;
- `store`: ``jobs.json``, so a restarted gateway keeps its jobs; `tokens`: job-scoped tokens;
- `planning`: the pool of GPUs for jobs, the policy's snapshot, throughputs learned online;
- `service`: `JobService`, the job table, its scheduling rounds and cells first.
"""
