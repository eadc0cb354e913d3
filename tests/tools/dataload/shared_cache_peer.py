"""One reader of a shared cache, as a process of its own (a user of its own when the tests run
as root): ``python shared_cache_peer.py BROKER KEY NAME SIZE EPOCHS``. Prints one JSON line:
the hits and misses of each epoch, whether every item equals the dataset's, and the uid."""

from __future__ import annotations

import json
import os
import sys

import torch

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.shared_cache import SharedCache
from kernelfleet.tools.dataload.synthetic import SyntheticDataset


def main(broker: str, key: str, name: str, size: int, epochs: int) -> None:
    dataset = SyntheticDataset(20, item_bytes=64)
    try:
        cache = SharedCache(dataset, size, key, name=name, broker=broker)
    except InvalidRequest as error:
        print(json.dumps({"error": error.message}))
        return
    counts, same = [], True
    for _ in range(epochs):
        for i in range(len(cache)):
            item, label = cache[i]
            same = same and torch.equal(item, dataset[i][0]) and label == dataset[i][1]
        spent = cache.reset_counts()
        counts.append([spent.hits, spent.misses])
    print(json.dumps({"counts": counts, "same": same, "uid": os.getuid()}))
    cache.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
