"""``%dataload``: find and remove data stalls in training (CoorDL / DS-Analyzer, VLDB'21).

- `analyze`: DS-Analyzer's differential measurement of a loader and a model (synthetic data,
  fully cached, cold) giving prep and fetch stalls; `whatif` predicts epoch times for other
  CPU counts and cache sizes from those measurements;
- `store` and `cache`: the MinIO cache (fill once, never evict) of a map-style ``Dataset`` in a
  named shared-memory segment, shared by a user's kernels and jobs on a host; `lru`: an LRU cache of
  the same interface, for comparison; `sizes`: "8GB", "512MiB", "1e9";
- `coordinate`: coordinated preparation, one producer for k consumers;
- `magics`: ``%dataload analyze``, ``%dataload cache``, ``%dataload coordinate``.

docs/dataload.md tells the whole story. Importing this package imports nothing heavy.
"""
