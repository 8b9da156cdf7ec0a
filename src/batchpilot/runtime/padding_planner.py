"""Model-based choice of an NLP batcher's padding-waste budget (length grouping), from the recent lengths.

Pure and clock-free, with a seeded generator of its own. A larger budget lets sequences of more different
lengths share a batch: fewer, larger batches (the per-batch cost b amortised over more items) but more
padded token slots (each costing the per-token cost a). With the batch cost fitted on computed (padded)
tokens, d = a * tokens + b, the planner groups queues drawn from the recent lengths the way the runtime's
`LengthGroupPolicy` does (around the oldest request, closest lengths first, within the budget, up to the
size limit), for every budget of a ladder, and predicts the CPU cost per item:

    cost(budget) = a * padded tokens per item + b / items per batch

The cheapest budget serves the most items per second of executor time; within 2% of it the smaller budget
wins (shorter batches, less padding in the tail). Not modelled: a queue refills while it is grouped, so
leftovers wait for the next release with newer company; the drained-queue estimate is what one release
sees at the queue length given.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from batchpilot.runtime.autotune_model import LatencyFit

__all__ = ["WASTE_LADDER", "PaddingPlan", "group_lengths", "plan_padding"]

WASTE_LADDER = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
DRAWS = 16  # queues drawn per budget (the same draws for every budget)
TIE = 0.02


@dataclass(frozen=True)
class PaddingPlan:
    waste: float  # the chosen budget
    cost_s: dict[float, float]  # predicted executor seconds per item, per budget
    tokens_per_item: dict[float, float]  # computed (padded) tokens per item, per budget
    items_per_batch: dict[float, float]


def group_lengths(lengths: Sequence[int], waste: float, max_batch: int) -> list[tuple[int, int]]:
    """Release a queue of sequences (oldest first) the way `LengthGroupPolicy` does (not FIFO-ordered):
    around the oldest, closest lengths first (ties in queue order), each joining while the batch's
    useful share of its padded slots stays >= 1 - waste. Returns (items, longest) per batch."""
    queue = list(lengths)
    batches = []
    min_efficiency = 1.0 - waste
    while queue:
        head = queue[0]
        order = sorted(range(len(queue)), key=lambda i: abs(queue[i] - head))
        items = useful = longest = 0
        taken: list[int] = []
        for i in order:
            length = queue[i]
            new_longest = max(longest, length)
            if taken and useful + length < min_efficiency * (items + 1) * new_longest:
                continue
            taken.append(i)
            items, useful, longest = items + 1, useful + length, new_longest
            if items >= max_batch:
                break
        batches.append((items, longest))
        chosen = set(taken)
        queue = [x for i, x in enumerate(queue) if i not in chosen]
    return batches


def plan_padding(
    lengths: Sequence[int],
    fit: LatencyFit,
    queue_items: int,
    max_batch: int,
    *,
    ladder: Sequence[float] = WASTE_LADDER,
    seed: int = 0,
) -> PaddingPlan:
    """The budget of `ladder` with the lowest predicted executor cost per item, for queues of
    `queue_items` sequences drawn from `lengths` (recent arrivals), batches of at most `max_batch` items
    and the token-cost fit `fit` (a per computed token, b per batch)."""
    if not lengths or queue_items < 1 or max_batch < 1:
        raise ValueError("need lengths, queue_items >= 1 and max_batch >= 1")
    rng = random.Random(seed)
    draws = [[rng.choice(lengths) for _ in range(queue_items)] for _ in range(DRAWS)]
    cost, tokens, per_batch = {}, {}, {}
    for waste in ladder:
        items = slots = batches = 0
        for queue in draws:
            for n, longest in group_lengths(queue, waste, max_batch):
                items += n
                slots += n * longest
                batches += 1
        tokens[waste] = slots / items
        per_batch[waste] = items / batches
        cost[waste] = fit.a_s * tokens[waste] + fit.b_s / per_batch[waste]
    best = min(cost.values())
    choice = min(w for w in ladder if cost[w] <= (1 + TIE) * best)
    return PaddingPlan(choice, cost, tokens, per_batch)
