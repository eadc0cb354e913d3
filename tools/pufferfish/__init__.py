"""Pufferfish (MLSys'21): low-rank factorised training, so that gradients are small by
construction (docs/pufferfish.md).

- `layers`: `FactorizedLinear` and `FactorizedConv2d`, SVD-initialised from a full-rank layer;
- `factorize`: which layers of a model to factorise (keep-full rules) and the swap itself;
- `counts`: closed-form parameter and all-reduce byte counts;
- `warmup`: full-rank warm-up epochs, then the switch at the boundary (optimizer included);
- `ddp`: a DDP comm hook that counts the bytes it all-reduces;
- `models`: a ResNet-18-size model for tests and benchmarks;
- `report`, `magics`: the ``%pufferfish`` table and magic.
"""
