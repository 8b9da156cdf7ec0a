"""What every model's executor spent in one process, so that each autotuner can tell its own CPU from the
others'. On one core the front-ends and all executors share the core: an autotuner that read the process's
CPU beyond its own executor as its own front-end cost would charge another model's work to its requests
(and both tuners would chase each other's changes). With the ledger, each reads the others' executor CPU
and items apart (`Autotuner.record_cpu`)."""

from __future__ import annotations


class CpuLedger:
    """Cumulative executor CPU seconds and items over every account (every autotuned model)."""

    def __init__(self) -> None:
        self.exec_s = 0.0
        self.items = 0

    def account(self) -> CpuAccount:
        return CpuAccount(self)


class CpuAccount:
    """One model's share of a ledger."""

    def __init__(self, ledger: CpuLedger) -> None:
        self.ledger = ledger
        self.exec_s = 0.0
        self.items = 0

    def add(self, cpu_s: float, items: int) -> None:
        """A batch of `items` executed in `cpu_s` CPU seconds of its executor."""
        self.exec_s += cpu_s
        self.items += items
        self.ledger.exec_s += cpu_s
        self.ledger.items += items

    def others(self) -> tuple[float, int]:
        """Every other account's executor CPU seconds and items so far."""
        return self.ledger.exec_s - self.exec_s, self.ledger.items - self.items


_SHARED = CpuLedger()


def shared_ledger() -> CpuLedger:
    """The process's ledger: the models of a server share its CPU."""
    return _SHARED
