"""The autotuner's policy constants, each with what it bounds (the rules that read them are in the
modules beside this one; `runtime/autotuner.py` describes the policy as a whole).
"""

from __future__ import annotations

MEASURE_S = 1.5  # shortest epoch
MAX_MEASURE_S = 5.0  # longest epoch, however few answers came (low load)
MIN_ANSWERS = 100  # answers behind a p99 worth comparing
SETTLE_S = (0.25, 2.0)  # after a change, data is counted from 3 x p99 later, within these bounds
TRIAL_MARGIN = 0.9  # a trial must keep its p99 under this share of the SLO
CHANGE_TRIGGER = 0.3  # relative change of arrival rate or mean latency that reopens the search
FIRST_LOOK_S = 0.5  # a fresh server's first epoch counts from this long on (its warm-up is not judged)
LOW_LOAD_COMPANY = 0.5  # expected companions within the delay under which an unplanned delay drops...
ALONE_BUSY = 0.5  # ...unless serving each arrival alone would keep the executor busier than this
FULL_SHARE = 0.5  # share of full batches over which the size limit binds...
BUSY = 0.75  # ...while the executor is this busy: a violation then calls for larger batches
BOTTLENECK = 0.9  # an executor this busy is the bottleneck: what it serves is all it can
IDLE = 0.5  # an open loop lowers its limit only while its executor and its core are less busy than this
LEVEL_BATCHES = 20  # an epoch's batches behind the level of an open loop's CPU fit (`readings.leveled`)...
LEVEL_BOUNDS = (0.67, 1.5)  # ...which moves it by these factors at most
OPEN_HEADROOM = 0.9  # an open loop may load a setting's full-batch capacity up to this share
PLAN_TRIALS = 3  # planned settings tried per search at most
GAIN = 0.03  # a planned setting must promise this much more items/s than the incumbent...
TAIL_GAIN = 0.2  # ...or, at the same items/s, this much less p99
TAIL_SLACK = (1.25, 0.001)  # a trial at the same items/s loses with a p99 over 1.25 x + 1 ms the incumbent's
PLAN_ITEMS = 2000  # simulated arrivals of an open-loop plan
PADDING_GAIN = 0.05  # a padding budget must promise this much less executor time per item
LENGTHS_KEPT = 2048  # recent sequence lengths the padding plan draws from
TOKEN_BATCHES = 256  # recent single-execution batches behind the per-token cost fit
MAX_CLIENTS = 512  # a closed loop of more clients is planned as an open one
GROWING = 1.05  # arriving this much faster than served: the queue grows
BACKLOG_SLOS = 2.0  # a queue holding this many SLOs' worth of work (at the pace served) is past waiting out
DRAINING = 1.1  # serving this much more than arrives: a backlog is draining, no violation is acted on
KEEP_PACE = 0.95  # a violation's pick must be predicted to serve this share of the measured arrival rate
SEVERE = 2.0  # an SLO break with a p99 over this multiple of the SLO is backed off at once
FUTILE = 3  # an open loop that broke the SLO at this many settings in a row (none met it between): infeasible...
HOLD_EPOCHS = 3  # ...until this many epochs in a row meet it with margin
REVISIT = 3  # an open loop's limit raised at a break that breaks the SLO this often tries the limit it replaced
MAX_BACKGROUND = 0.9  # the most of a shared core that other models are taken to leave this one without
BESIDE = 0.1  # share of the core other models take from which a model counts as sharing it...
SATURATED = 0.75  # ...and share of it busy (every model) from which the core counts as saturated
FULL = 0.95  # a frugal loop's batches hold this share of its clients (or its limit): full
LOAD_MOVED = 1.5  # a closed loop's population this many times another's is another load (a trial is not judged)
PACE_BATCHES = 8  # recent batches of a size behind its measured pace (`_pace`)...
SLOWER = 1.25  # ...and how much more items/s a smaller limit's must have served for a larger one to count as slower
PACE_DRIFT = 0.08  # ...or, in a closed loop, by this much at least (paces measured apart: the host drifts between)
PACE_SETTLE_S = 2.0  # ...counting no batch that ran within this long of its limit's latest start
MEDIAN_SE = 1.2533  # a median's standard error over the mean's (normal samples): a pace's noise (`_pace_of`)
IDLE_AFTER_S = 1.0  # nothing in the server and nothing arrived for this long: the model takes none of the core
REMEMBERED = 8  # closed-loop populations whose settled setting is kept (`_recall`)
FELL_BATCHES = 8  # a closed loop's latest batches over which its population is read again within an epoch (`_fell`)...
FELL_ARRIVALS = 16  # ...with at least this many arrivals since
QUICK_S = 0.5  # the epoch that measures a fallen population ends this soon...
QUICK_ANSWERS = 20  # ...with this many answers
