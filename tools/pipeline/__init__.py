"""Pipeline parallelism: PipeDream's profiles and partitioner (``kernelfleet pipeline-plan``).

- `profiles`: `LayerProfile` and `ModelProfile`, a model as layers in planning order;
- `graphfile`: PipeDream's ``graph.txt`` profiles, read in PipeDream's order;
- `profiler`: measures a ``torch.nn.Sequential``-like model on a sample batch;
- `planner`: PipeDream's dynamic programme, returning a frozen `Plan`;
- `render`: the plan as a table and a small diagram; `app`: the command line (docs/pipeline.md);
- `stages`, `schedules`, `runner`, `worker`, `channel`: running a plan with torch's pipeline
  schedules on worker processes, the notebook driving (``%pipeline run``);
- `magics`: ``%pipeline profile|plan|run``.
"""
