"""The kernels the gateway runs, by id, and their durable copy in the `KernelStore`."""

from __future__ import annotations

from kernelfleet.errors import NotFound
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord
from kernelfleet.gateway.store import KernelStore, StateUnreadable


class KernelTable:
    """Every `KernelRecord` of this gateway. Whoever changes a kernel calls `persist` after."""

    def __init__(self, store: KernelStore | None = None) -> None:
        self._store = store
        self._kernels: dict[str, KernelRecord] = {}

    def get(self, kernel_id: str) -> KernelRecord:
        """The kernel `kernel_id`; `NotFound` if there is none."""
        try:
            return self._kernels[kernel_id]
        except KeyError:
            raise NotFound(f"no kernel with id {kernel_id!r}") from None

    def all(self) -> list[KernelRecord]:
        return list(self._kernels.values())

    def ids(self) -> list[str]:
        return list(self._kernels)

    def add(self, kernel: KernelRecord) -> None:
        self._kernels[kernel.id] = kernel

    def pop(self, kernel_id: str) -> KernelRecord | None:
        """Remove and return the kernel; None if it was gone already."""
        return self._kernels.pop(kernel_id, None)

    def is_current(self, kernel: KernelRecord) -> bool:
        """Whether `kernel` is still this table's record (not shut down meanwhile)."""
        return self._kernels.get(kernel.id) is kernel

    def live_replicas_on(self, host_id: str) -> list[tuple[KernelRecord, ReplicaRecord]]:
        """Every (kernel, replica) whose replica runs on `host_id` and is not dead."""
        return [
            (kernel, replica)
            for kernel in self._kernels.values()
            for replica in kernel.replicas
            if replica.host_id == host_id and not replica.dead
        ]

    def persist(self) -> None:
        """Write every kernel to the store (after each change; cheap: small JSON)."""
        if self._store is not None:
            self._store.save([kernel.to_state() for kernel in self._kernels.values()])

    def stored(self) -> list[KernelRecord]:
        """The kernels the store holds (a previous gateway's), not yet added to the table;
        `StateUnreadable`, naming the file, if it cannot be read or a kernel in it makes no
        sense."""
        if self._store is None:
            return []
        states = self._store.load()
        try:
            return [KernelRecord.from_state(state) for state in states]
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise StateUnreadable(
                f"the state file {self._store.path} holds a kernel that cannot be read ({e!r})"
            ) from e
