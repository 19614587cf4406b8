"""What every embedder shares about model calls on a CPU: how many threads, and batches of like length."""

from __future__ import annotations

import os
from collections.abc import Sequence

MAX_PADDING = 0.25  # the share of a forward pass that may be padding before a batch is split


def default_threads() -> int:
    """Threads for model calls: as many as the CPUs this process may run on.

    Safe only when idle threads wait passively. Torch's OpenMP workers spin while they wait unless
    `OMP_WAIT_POLICY=PASSIVE` (which `toolsearch` sets before torch loads), so when another process
    takes a core, every thread of a model call waits for the slowest. On two cores with a busy loop
    beside them, two spinning threads embedded 10 to 42 texts a second where one thread embedded 69
    to 109; waiting passively, two threads match one there, and on idle cores embed batches 1.5 to
    1.8 times faster. ONNX Runtime's threads are told not to spin (`indexer.embedder.onnx`).
    """
    return max(1, len(os.sched_getaffinity(0)))


def padding_batches(lengths: Sequence[int], max_size: int, max_waste: float = MAX_PADDING) -> list[list[int]]:
    """Positions of `lengths` in batches, longest first, each padding at most `max_waste` of its size.

    A batch's cost is its count times its longest; the padding is what its shorter texts leave of
    that. A batch closes when the next text would take the padding past `max_waste`, or at `max_size`.
    """
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    batches: list[list[int]] = []
    batch: list[int] = []
    used = 0
    for row in order:
        if batch:
            longest = max(lengths[batch[0]], 1)
            padded = (len(batch) + 1) * longest
            if len(batch) >= max_size or padded - (used + lengths[row]) > max_waste * padded:
                batches.append(batch)
                batch, used = [], 0
        batch.append(row)
        used += lengths[row]
    if batch:
        batches.append(batch)
    return batches
