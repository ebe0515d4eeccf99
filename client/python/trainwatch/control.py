"""The trainer's side of the closed loop (docs/closed-loop.md): apply the
server's directives, exactly once, on every rank at the same step.

    control = trainwatch.Control(tw, save=save, load=load,
                                 set_lr_scale=set_lr_scale, stop=stop)
    batches = control.filter(batches)          # drops the skipped batch ids
    for step in ...:
        ...forward, backward...
        b = control.boundary(step)             # before optimizer.step()
        if b.rollback:                         # load(to_step, checkpoint) ran
            tw = control.tw                    # a new attempt's client
            ...resume at b.resume_step from the checkpoint's data position...
            continue
        if b.stop:
            break
        optimizer.step()

The callbacks belong to the loop: save(tag) writes a checkpoint (Control
then sends its CHECKPOINT_SAVED event), load(step, checkpoint) restores the
model, optimizer, scheduler and data position of the checkpoint saved at
`step` under that name, set_lr_scale(factor) multiplies the learning rate
from now on, stop() ends the run. A missing callback makes its action
REJECTED ("no load callback") instead of applied, but for load: without it a
rollback is applied by a restart of the process (EXIT_RESTART).

Thread-safety: one Control per rank, used from the training loop only.
"""

import json
import os
import sys

from .restart import item_ids

__all__ = ["Control", "Boundary", "EXIT_RESTART"]

# The exit code of a trainer that applies a rollback by being restarted
# (BSD's EX_TEMPFAIL, which launchers such as torchrun's wrappers and Slurm
# requeue scripts read as "run me again"): the launcher starts it again as
# attempt + 1 and it resumes from Control.read_restart_file().
EXIT_RESTART = 75


class Boundary:
    """What Control.boundary() did at one step. Falsy when the loop has
    nothing to do (it may still have saved a checkpoint or added skips).

    applied: the directives applied at this step (dicts, by seq).
    rollback: the rollback directive applied in process, or None; the loop
        then resumes at resume_step (to_step + 1) from the data position
        load() restored, with control.tw (the new attempt's client), and
        does not take this step's optimizer step.
    stop: a Stop was applied (stop() ran): end the loop.
    """

    __slots__ = ("applied", "rollback", "stop")

    def __init__(self, applied=(), rollback=None, stop=False):
        self.applied = list(applied)
        self.rollback = rollback
        self.stop = stop

    @property
    def resume_step(self):
        return None if self.rollback is None else self.rollback["rollback"]["to_step"] + 1

    def __bool__(self):
        return self.rollback is not None or self.stop

    def __repr__(self):
        return (f"Boundary(applied={[d['id'] for d in self.applied]}, "
                f"rollback={self.rollback and self.rollback['id']}, stop={self.stop})")


_NOTHING = Boundary()


def _distributed():
    """torch.distributed, when initialised with more than one rank."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


class Control:
    """Applies the closed loop's directives to a training loop.

    tw: this rank's trainwatch.Client.
    save, load, set_lr_scale, stop: the loop's callbacks (module docstring).
    restart_file: where a rollback without `load` writes what the restarted
        process needs (read_restart_file) before exiting with EXIT_RESTART.
    reopen: on an in-process rollback, replace tw by tw.new_attempt() (a
        new attempt's stream: steps of one attempt never go back). False
        for a loop that opens its clients itself (then pass
        last_applied_seq as last_applied_directive and attempt + 1).

    Exactly once: an id is applied at most once, and the seq of the last one
    applied, the ids applied and the skip set are in state_dict(): save it
    with every checkpoint and load_state_dict() it on a restart (and pass
    last_applied_seq to the Client as last_applied_directive), so that a
    rollback, a requeue, a duplicate approval or a reconnect never applies
    one twice.

    Ranks: with torch.distributed initialised, boundary() is a collective
    (every rank calls it at every step): the ranks first agree on whether
    anything is due (one all_reduce of one int), then on what (each rank's
    due (id, apply_at_step) pairs, all_gather_object), and apply only what
    every rank has, at its apply_at_step: the same directives at the same
    step everywhere. One that some rank has not received by its step is
    late: each rank that holds it answers REJECTED "late" and the server
    reissues it for a later step.
    """

    def __init__(self, tw, save=None, load=None, set_lr_scale=None, stop=None,
                 restart_file=None, reopen=True):
        self.tw = tw
        self._save = save
        self._load = load
        self._set_lr_scale = set_lr_scale
        self._stop = stop
        self.restart_file = None if restart_file is None else os.fspath(restart_file)
        self.reopen = reopen
        self.last_applied_seq = 0
        self.applied_ids = set()
        self.skip_ids = set()
        self.skipped = 0  # items filter() dropped
        # (directive id, step applied, step due) of this process's applications.
        self.log = []

    # -- data ------------------------------------------------------------------

    def filter(self, batches, key=None):
        """Iterates `batches` without the items holding a skipped batch id.

        An item's ids are read as trainwatch.SkipBatches reads them:
        key(item) when given; else the last element of a tuple or list item
        ((inputs, targets, ids), or (index, ids) as train_tiny_lm.py's
        sampler yields); else the item itself (a sampler's index, a batch
        sampler's list of indices). The skip set is read at each item, so a
        Skip applied while iterating takes effect on the next item.
        """
        for item in batches:
            if self.skip_ids and any(i in self.skip_ids for i in item_ids(item, key)):
                self.skipped += 1
                continue
            yield item

    # -- the step boundary -----------------------------------------------------

    def boundary(self, step):
        """Applies what is due at `step`; call it before optimizer.step()
        (every rank, every step, when distributed). Returns a Boundary."""
        due = self.tw.due_directives(step)
        dist = _distributed()
        if dist is not None:
            due = self._agree(dist, step, due)
        elif not due:
            return _NOTHING
        else:
            due = [(d, d["apply_at_step"] == step) for d in due]
        if not due:
            return _NOTHING
        result = Boundary()
        for d, now in due:
            if d["id"] in self.applied_ids:
                # Delivered again (a reconnect, a restart that lost the ack):
                # the answer is the same, and nothing happens twice.
                self.tw.ack_directive(d["id"], "applied", "already applied")
                continue
            if not now:
                if d["apply_at_step"] < step:
                    self.tw.ack_directive(d["id"], "rejected",
                                          f"late: at step {step}, due at {d['apply_at_step']}")
                continue
            if result.rollback is not None or result.stop:
                continue  # the loop starts over: the rest waits for its step
            self._apply(d, step, result)
        return result

    def _agree(self, dist, step, due):
        """[(directive, apply now)] that every rank computes alike."""
        torch = sys.modules["torch"]
        device = "cpu"
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        flag = torch.tensor([len(due)], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) == 0:
            return []
        keys = [(d["id"], d["apply_at_step"]) for d in due]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, keys)
        common = set(gathered[0]).intersection(*map(set, gathered[1:]))
        return [(d, key in common and d["apply_at_step"] == step)
                for d, key in zip(due, keys)]

    def _apply(self, d, step, result):
        action = d["action"]
        fields = d.get(action, {})
        missing = {"checkpoint_now": self._save, "scale_lr": self._set_lr_scale,
                   "stop": self._stop}
        if action == "rollback" and self._load is None and self.restart_file is None:
            self.tw.ack_directive(d["id"], "rejected", "no load callback and no restart_file")
            return
        if action in missing and missing[action] is None:
            name = {"checkpoint_now": "save", "scale_lr": "set_lr_scale"}.get(action, action)
            self.tw.ack_directive(d["id"], "rejected", f"no {name} callback")
            return
        if action not in ("checkpoint_now", "skip", "rollback", "scale_lr", "stop"):
            self.tw.ack_directive(d["id"], "rejected", f"unknown action {action!r}")
            return
        if action == "rollback" and self._load is None:
            self._restart(d, step)  # exits
        try:
            if action == "checkpoint_now":
                tag = fields.get("tag") or f"directive-{d['seq']}-step-{step}"
                self._save(tag)
                self.tw.event("checkpoint_saved", step, tag)
            elif action == "skip":
                self.skip_ids.update(int(i) for i in fields.get("batch_ids", ()))
            elif action == "rollback":
                self._load(fields["to_step"], fields["checkpoint"])
                self.skip_ids.update(int(i) for i in fields.get("skip_batch_ids", ()))
                scale = fields.get("lr_scale", 1.0) or 1.0
                if scale != 1.0:
                    if self._set_lr_scale is None:
                        raise RuntimeError("a rollback scales the LR and there is no "
                                           "set_lr_scale callback")
                    self._set_lr_scale(scale)
            elif action == "scale_lr":
                self._set_lr_scale(fields["factor"])
            elif action == "stop":
                if fields.get("checkpoint_first") and self._save is not None:
                    tag = f"stop-step-{step}"
                    self._save(tag)
                    self.tw.event("checkpoint_saved", step, tag)
                self._stop()
        except Exception as e:
            self.tw.ack_directive(d["id"], "rejected", f"{type(e).__name__}: {e}"[:1024])
            raise
        self._mark_applied(d, step)
        result.applied.append(d)
        if action == "rollback":
            result.rollback = d
            self._new_attempt()
        elif action == "stop":
            result.stop = True

    def _mark_applied(self, d, step):
        self.tw.ack_directive(d["id"], "applied")
        self.applied_ids.add(d["id"])
        self.last_applied_seq = max(self.last_applied_seq, d["seq"])
        self.log.append((d["id"], step, d["apply_at_step"]))

    def _new_attempt(self):
        """After an in-process rollback the steps go back: a new attempt's
        stream, opened once the old one has delivered the APPLIED ack."""
        if not self.reopen:
            return
        old = self.tw
        try:
            old.flush(timeout=30.0)
        except (TimeoutError, PermissionError, RuntimeError):
            pass  # the ack stays queued; close() tries again
        self.tw = old.new_attempt(last_applied_directive=self.last_applied_seq)
        old.close(timeout=10.0)

    def _restart(self, d, step):
        """A rollback the loop cannot do in process: record it, ack it, and
        exit with EXIT_RESTART for the launcher to start attempt + 1."""
        fields = d["rollback"]
        self.skip_ids.update(int(i) for i in fields.get("skip_batch_ids", ()))
        self._mark_applied(d, step)
        state = self.state_dict()
        state["resume"] = {"to_step": fields["to_step"], "checkpoint": fields["checkpoint"],
                           "lr_scale": fields.get("lr_scale", 1.0) or 1.0}
        tmp = self.restart_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.restart_file)
        try:
            self.tw.flush(timeout=30.0)
        finally:
            self.tw.close(timeout=10.0)
        raise SystemExit(EXIT_RESTART)

    @staticmethod
    def read_restart_file(path):
        """The state a rollback by restart left (None when there is none):
        state_dict()'s keys plus "resume" {to_step, checkpoint, lr_scale},
        the checkpoint to load and the LR scale to apply. Open the Client
        with attempt = state["attempt"] + 1 and last_applied_directive =
        state["last_applied_seq"], and load_state_dict(state) into the new
        Control."""
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    # -- checkpointed state ----------------------------------------------------

    def state_dict(self):
        """What the trainer checkpoints: last_applied_seq, applied_ids,
        skip_batch_ids and the client's attempt (plain, JSON-able data)."""
        return {"last_applied_seq": self.last_applied_seq,
                "applied_ids": sorted(self.applied_ids),
                "skip_batch_ids": sorted(self.skip_ids),
                "attempt": getattr(self.tw, "attempt", 0)}

    def load_state_dict(self, state):
        """Merges a saved state into this one: the ids applied and the skip
        set are unions and the seq the larger, so that loading an older
        checkpoint (a rollback's load() may) never forgets an application."""
        self.last_applied_seq = max(self.last_applied_seq, int(state.get("last_applied_seq", 0)))
        self.applied_ids.update(state.get("applied_ids", ()))
        self.skip_ids.update(int(i) for i in state.get("skip_batch_ids", ()))
