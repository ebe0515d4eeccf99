"""The restart loop (docs/detectors.md): ask the server for the plan of a run's
latest spike, then skip its batches on the next attempt.

    plan = trainwatch.restart_plan("127.0.0.1:50051", "llama/run-42")
    if plan and not plan["outcome"]:
        load_checkpoint(plan["checkpoint"])          # step plan["restart_from_step"]
        sampler = trainwatch.SkipBatches(sampler, plan["skip_batch_ids"])

After the new attempt (a Client with attempt + 1) has trained past the
spike's step, the server marks the spike "recovered" or "recurred"
(`trainwatchctl spikes`, and plan["outcome"] here).
"""

import os

from . import _trainwatch

__all__ = ["restart_plan", "SkipBatches"]


def restart_plan(address, run, auth_token=None, tls=False, tls_ca_file=None,
                 tls_cert_file=None, tls_key_file=None, timeout=10.0):
    """The plan of `run`'s latest spike, or None when it has none.

    A dict: run, spike_step, restart_from_step (None without a checkpoint at
    least 100 steps before the spike), checkpoint (that checkpoint event's
    detail), skip_batch_ids, outcome ("" until a new attempt replayed the
    spike's steps, then "recovered" or "recurred"), batches_skipped (that
    attempt left the batch ids out), why (what happened and what to do).
    Raises FileNotFoundError for a run the server does not know,
    PermissionError for a refused call, TimeoutError, RuntimeError otherwise.
    """
    if auth_token is None:
        auth_token = os.environ.get("TRAINWATCH_TOKEN", "").strip()
    files = [("" if f is None else os.fspath(f))
             for f in (tls_ca_file, tls_cert_file, tls_key_file)]
    return _trainwatch.restart_plan(address, run, auth_token, bool(tls), *files,
                                    float(timeout))


def item_ids(item, key=None):
    """The ids of a data item as SkipBatches and Control.filter read them:
    key(item) when given; else, for a tuple or list item whose last element
    holds ids (not a list of ints itself), that element; else the item
    itself. A list of ints."""
    if key is not None:
        ids = key(item)
    elif isinstance(item, (list, tuple)) and item and not all(
            isinstance(x, int) for x in item):
        ids = item[-1]  # (inputs, ..., ids)
    else:
        ids = item
    if hasattr(ids, "tolist"):  # tensors, numpy arrays
        ids = ids.tolist()
    if isinstance(ids, (list, tuple)):
        return [int(x) for x in ids]
    return [int(ids)]


class SkipBatches:
    """Iterates `source` (a sampler, a batch sampler, a DataLoader or any
    iterable) without the items whose ids are in `skip`.

    key(item) gives an item's id or ids; by default the item itself (a
    sampler's index, or a batch sampler's list of indices), and for a tuple
    or list item whose last element holds ids, that element. An item is
    dropped when any of its ids is to be skipped. `skipped` counts the
    dropped items, `dropped_ids` lists their ids (for the log of the
    restart).

        loader = DataLoader(ds, batch_sampler=SkipBatches(batch_sampler, plan["skip_batch_ids"]))
    """

    def __init__(self, source, skip, key=None):
        self.source = source
        self.skip = frozenset(int(i) for i in skip)
        self.key = key
        self.skipped = 0
        self.dropped_ids = []

    def __iter__(self):
        for item in self.source:
            ids = item_ids(item, self.key)
            hit = [i for i in ids if i in self.skip]
            if hit:
                self.skipped += 1
                self.dropped_ids.extend(hit)
                continue
            yield item

    def __len__(self):
        # A DataLoader asks its batch sampler for its length; an upper bound.
        return len(self.source)
