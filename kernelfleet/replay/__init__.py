"""Live trace replay: drive a real gateway through the Jupyter protocol like a population of
notebook users, and measure what it does (``kernelfleet replay``).

The trace parsing, session recovery and session model (kernel lead time, linger, idle timeout)
are the simulator's (`kernelfleet.scheduler.trace`, `SimulationConfig`), so a replay and a
simulation of the same slice differ only where the live gateway differs from the model.

- `plan`: the pure part: which cell runs when, in wall seconds, for a time scale;
- `client`: a small async client of the gateway's REST API and kernel websocket;
- `meter`: polls ``GET /api/fleet/hosts`` and ``/api/fleet/kernels`` into GPU-hour gauges;
- `driver`: runs every session concurrently and collects a `ReplayResult`;
- `app`: the ``kernelfleet replay`` command.
"""
