"""The fields of one policy's result in the simulator's JSON (`PolicyResult.as_json`), each
group in the order it is written; tools outside the project read them, so once a field is here
its name and meaning never change."""

from __future__ import annotations

POLICY_FIELDS = (
    "gpu_hours_provisioned",
    "gpu_hours_committed",
    "start_delay_s",
    "migrations",
    "scale_outs",
    "scale_ins",
    "events",
)
"""The fields from before the floor was added."""
FLOOR_FIELDS = ("gpu_hours_busy", "gpu_hours_floor", "gpu_hours_reservation", "saving_share")
"""The fields added with the GPU-hour floor (docs/economics.md)."""
HOST_KIND_FIELDS = (
    "dollars",
    "dollars_on_demand",
    "gpu_hours_spot",
    "revocations",
    "replacements",
    "replacements_failed",
    "kernels_lost",
    "cells_interrupted",
    "gpu_hours_redone",
)
"""The fields added with host kinds (docs/economics.md, "Transient hosts")."""
DOCUMENTED_FIELDS = POLICY_FIELDS + FLOOR_FIELDS + HOST_KIND_FIELDS
"""Every field, in the order the JSON has them."""
