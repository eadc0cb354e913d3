"""``%dataload``: measure data stalls, cache a dataset in shared memory, coordinate loaders.

::

    %dataload analyze LOADER MODEL [--batches N] [--cpus 1,2,8] [--cache 1GB,4GB] [--as-found]
                        DS-Analyzer's differential measurement of the notebook's DataLoader
                        feeding MODEL, and the predicted epoch time for other CPUs and caches
    %dataload cache DATASET --size 8GB [--name NAME] [--share [KEY]]
                        DATASET wrapped in a MinIO cache in shared memory, shared by the
                        user's kernels and jobs on the host that name the same cache; with
                        --share, held by the host agent and shared by the kernels of every
                        user that pass KEY (alone: prints a new key)
    %dataload cache --drop NAME
                        remove the cache NAME from the host
    %dataload coordinate LOADER --group NAME --consumers K [--share [KEY]]
                        one producer prepares each minibatch once for K consumers; with
                        --share, consumers of other users too (alone: prints a new key)

A thin shell over `analyze`, `cache` and `coordinate`: parse, call, show. ``analyze`` returns a
`Report` (``.analysis`` holds the figures); ``cache`` returns the `cache.MinioCache`, to assign
(``cached = %dataload cache ds --size 8GB``) and hand to a ``DataLoader``; ``coordinate``
returns what `coordinate.coordinate` returns. The cache's name is ``--name`` or one made from
the dataset's identity (its repr shows it): whoever no longer needs the cache drops it with
``--drop``, since it outlives every kernel that used it. Bad arguments and the tools' refusals
(a cache larger than the free shared memory, with both sizes) raise ``UsageError``.
"""

from __future__ import annotations

import argparse
import html
import importlib
import os
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.magics.parsing import MagicParser, count_in, parse
from kernelfleet.tools.dataload.share import check_key, new_key
from kernelfleet.tools.dataload.sizes import parse_size

MAX_BATCHES = 100_000


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%dataload``."""
    ipython.register_magics(DataloadMagics)


def size(text: str) -> int:
    """An argparse ``type``: a byte size (see `sizes.parse_size`)."""
    try:
        return parse_size(text)
    except InvalidRequest as error:
        raise argparse.ArgumentTypeError(error.message) from None


def sizes(text: str) -> list[int]:
    """An argparse ``type``: byte sizes separated by commas."""
    return [size(word) for word in text.split(",")]


def cpu_counts(text: str) -> list[int]:
    """An argparse ``type``: CPU counts from 1, separated by commas."""
    count = count_in(1, 1_000_000)
    return [count(word.strip()) for word in text.split(",")]


def dataload_parser() -> MagicParser:
    parser = MagicParser(
        prog="%dataload",
        description="Data stalls in training: measure them (DS-Analyzer), cache a dataset in "
        "shared memory (MinIO), prepare minibatches once for several consumers (CoorDL).",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=MagicParser)
    analyze = commands.add_parser("analyze", help="measure prep and fetch stalls, and what-if")
    analyze.add_argument("loader", help="a notebook variable: a torch DataLoader")
    analyze.add_argument("model", help="a notebook variable: a torch Module or a step function")
    analyze.add_argument("--batches", type=count_in(2, MAX_BATCHES), default=20,
                         help="minibatches each pass measures (20)")  # fmt: skip
    analyze.add_argument("--cpus", type=cpu_counts, help="CPU counts of the what-if table")
    analyze.add_argument("--cache", type=sizes, help="cache sizes of the what-if table")
    analyze.add_argument("--as-found", action="store_true",
                         help="leave the page cache as it is (else drop it)")  # fmt: skip
    cache = commands.add_parser("cache", help="wrap a dataset in a shared MinIO cache")
    cache.add_argument("dataset", nargs="?", help="a notebook variable: a map-style Dataset")
    cache.add_argument("--size", type=size, help="bytes of shared memory: 8GB, 512MiB, 1e9")
    cache.add_argument("--name", help="the cache's name on the host (the dataset's identity)")
    cache.add_argument("--drop", metavar="NAME", help="remove the cache NAME from the host")
    cache.add_argument("--share", nargs="?", const="", metavar="KEY",
                       help="a cache the host agent holds for every user's kernels that pass "
                       "KEY; alone: make a new key and print it")  # fmt: skip
    coordinate = commands.add_parser("coordinate", help="one producer for K consumers")
    coordinate.add_argument("loader", help="a notebook variable: a torch DataLoader")
    coordinate.add_argument("--group", required=True, help="the name the consumers share")
    coordinate.add_argument("--consumers", type=count_in(1, 1024), required=True,
                            help="how many kernels consume the minibatches")  # fmt: skip
    coordinate.add_argument("--share", nargs="?", const="", metavar="KEY",
                            help="admit the kernels of other users that pass KEY; alone: make "
                            "a new key and print it")  # fmt: skip
    return parser


@dataclass(frozen=True)
class Report:
    """What ``%dataload analyze`` shows: ``text`` (also as HTML) and the `Analysis`."""

    text: str
    analysis: Any

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"


@magics_class
class DataloadMagics(Magics):
    """``%dataload``: see the module docstring."""

    @line_magic
    def dataload(self, line: str) -> Any:
        args = parse(dataload_parser(), line)
        if args is None:
            return None
        handler = {"analyze": self._analyze, "cache": self._cache, "coordinate": self._coordinate}
        try:
            return handler[args.command](args)
        except InvalidRequest as error:
            raise UsageError(error.message) from None

    def _analyze(self, args: argparse.Namespace) -> Report:
        from kernelfleet.tools.dataload.analyze import analyze, render

        loader, model = self._variable(args.loader), self._variable(args.model)
        analysis = analyze(loader, model, args.batches, drop_page_cache=not args.as_found)
        cores = len(os.sched_getaffinity(0))
        cpus = args.cpus or sorted({1, analysis.cpus, cores, 2 * cores})
        whole = analysis.dataset_bytes
        caches = args.cache or [0.0, whole / 4, whole / 2, whole]
        return Report(render(analysis, cpus, caches), analysis)

    def _cache(self, args: argparse.Namespace) -> Any:
        from kernelfleet.tools.dataload.cache import MinioCache, drop_cache

        if args.drop:
            if args.dataset or args.size or args.name or args.share == "":
                raise UsageError("give --drop NAME alone (and --share KEY for a shared cache)")
            if args.share is not None:
                return self._drop_shared(args.drop, args.share)
            if not drop_cache(args.drop):
                raise UsageError(f"there is no cache named {args.drop!r} on this host")
            print(f"dropped the cache {args.drop!r}")
            return None
        if not args.dataset or args.size is None:
            raise UsageError("give the notebook's DATASET and --size (or --drop NAME)")
        dataset = self._variable(args.dataset)
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise UsageError(f"{args.dataset} is not a map-style dataset (no len and indexing)")
        if args.share is None:
            return MinioCache(dataset, args.size, name=args.name)
        from kernelfleet.tools.dataload.shared_cache import SharedCache

        key = self._share_key(args.share, f"cache {args.name or 'of ' + args.dataset}",
                              f"%dataload cache DATASET --size {args.size} "
                              f"{'--name ' + args.name + ' ' if args.name else ''}")  # fmt: skip
        return SharedCache(dataset, args.size, key, name=args.name)

    def _drop_shared(self, name: str, key: str) -> None:
        from kernelfleet.tools.dataload.shared_cache import drop_shared_cache

        try:
            dropped = drop_shared_cache(name, key)
        except ValueError as error:  # a malformed key
            raise UsageError(str(error)) from None
        if not dropped:
            raise UsageError(f"the host agent holds no shared cache named {name!r}")
        print(f"dropped the shared cache {name!r}")

    def _share_key(self, given: str, what: str, line: str) -> str:
        """``--share``'s key: a new one, printed with the line for the others, or the one
        given, checked."""
        if given == "":
            key = new_key()
            print(f"share key of the {what}: {key}\nin the other kernels: {line}--share {key}",
                  flush=True)  # fmt: skip
            return key
        try:
            return check_key(given)
        except ValueError as error:
            raise UsageError(str(error)) from None

    def _coordinate(self, args: argparse.Namespace) -> Any:
        # imported by name: coordinate.py is another change's, and may land after this one
        module = "kernelfleet.tools.dataload.coordinate"
        try:
            coordinate = importlib.import_module(module).coordinate
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
            raise UsageError("coordinated preparation is not in this kernelfleet") from None
        loader = self._variable(args.loader)
        key = args.share
        if key is not None:
            line = f"%dataload coordinate LOADER --group {args.group} --consumers {args.consumers} "
            key = self._share_key(key, f"group {args.group}", line)
        return coordinate(loader, args.group, consumers=args.consumers, share=key)

    def _variable(self, name: str) -> Any:
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name not in namespace:
            raise UsageError(f"{name} is not defined in the notebook")
        return namespace[name]
