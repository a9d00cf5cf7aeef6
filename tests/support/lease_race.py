"""Jobs taking one storage path's lease at the same time, each on a thread of its own."""

from __future__ import annotations

import threading

from herald.storage.lease import LeaseHeld, StorageLease


def race(leases: list[StorageLease]) -> list[str]:
    """Every lease's `acquire()` started at once; what each ended with, in order: "holds", "refused" (LeaseHeld),
    or the error it raised ("<type>: <message>", cut to 300 characters)."""
    outcomes: dict[int, str] = {}

    def take(index: int) -> None:
        try:
            leases[index].acquire()
            outcomes[index] = "holds"
        except LeaseHeld:
            outcomes[index] = "refused"
        except Exception as error:  # noqa: BLE001 - collected: the caller's assertion names it
            outcomes[index] = f"{type(error).__name__}: {error}"[:300]

    threads = [threading.Thread(target=take, args=(index,)) for index in range(len(leases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [outcomes.get(index, "no outcome") for index in range(len(leases))]
