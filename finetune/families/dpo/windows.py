"""Each accumulation window's totals of a loss's units, counted on the host from the epoch's order, so a
loss of several terms (DPO's pairs, RPO's chosen target tokens) divides each by its whole window's count
before backward: no collective, the same on every rank, whatever the cut into micro-batches and ranks."""

from __future__ import annotations


class WindowTotals:
    """The windows of an epoch: `gradient_accumulation_steps` consecutive global batches of the training
    order from the epoch's start (the last one partial), as Accelerate's `accumulate` syncs them. `order`:
    the training loader's `RankBatches`, whose global batch g is its micro-batches g x world .. g x world +
    world - 1; a placeholder (`~i`) weighs nothing. `columns`: per-row counts of each term's units (the
    `pairs` term counts each row once)."""

    def __init__(self, order, columns: dict[str, list], accumulation: int):
        self.order = order
        self.columns = columns
        self.accumulation = accumulation
        self.epoch = None
        self.windows: list[dict] = []

    def of(self, epoch: int, window: int) -> dict[str, float]:
        """{term: its total} for window `window` of `epoch` (counted once an epoch)."""
        if epoch != self.epoch:
            self.windows, self.epoch = self._count(epoch), epoch
        return self.windows[window]

    def _count(self, epoch: int) -> list[dict]:
        self.order.set_epoch(epoch)  # the order is a pure function of (seed, epoch): the loader's own
        micro_batches = list(self.order)
        per_window = self.order.world_size * self.accumulation
        windows = []
        for start in range(0, len(micro_batches), per_window):
            rows = [i for batch in micro_batches[start : start + per_window] for i in batch if i >= 0]
            totals = {"pairs": float(len(rows))}
            for term, counts in self.columns.items():
                totals[term] = float(sum(counts[i] for i in rows))
            windows.append(totals)
        return windows
