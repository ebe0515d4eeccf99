"""The closed loop end to end (docs/closed-loop.md): the real server in
--closed-loop auto or propose, real PyTorch loops on CPU applying its
directives through trainwatch.Control, and trainwatchctl reading the record.

The example's runs (train_tiny_lm.py --fault diverge) take ~600 steps: the
divergence needs a level of 100 losses before it and 50 steps of staying up
after it, and the restart plan a checkpoint 100 steps before its onset."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, Server, eventually

torch = pytest.importorskip("torch")
import trainwatch  # noqa: E402  (the build's package, found by conftest)

EXAMPLE = REPO / "client" / "examples" / "train_tiny_lm.py"
STEPS = 450


def config(tmp_path, mode, auto="checkpoint_now, skip, rollback", **extra):
    lines = ["closed_loop:", f"  mode: {mode}", f"  auto: [{auto}]"]
    lines += [f"  {k}: {v}" for k, v in extra.items()]
    path = tmp_path / "closed_loop.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def auto_server(tmp_path):
    s = Server(tmp_path, ["--config", config(tmp_path, "auto")])
    yield s
    s.stop()


def example(server, run, *args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--server", server.address, "--run", run,
         "--steps", str(STEPS), "--threads", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def finish(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def final_loss(out):
    m = re.search(r"final loss ([\d.]+)", out)
    assert m, out
    return float(m.group(1))


def poll(what, fn, timeout=120):
    """fn()'s first truthy value, polled until `timeout` seconds (the
    harness's eventually())."""
    return eventually(fn, timeout=timeout, interval=0.1, what=what)


def applied_steps(out):
    """(directive id, step applied at, apply_at_step) from the example's log."""
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"DIRECTIVE (\S+) \w+ applied at step (\d+) \(apply_at_step (\d+)", out)]


def rank_applied(record):
    return [t for t in record["transitions"] if t["state"] == "RANK_APPLIED"]


def test_auto_rollback_recovers_the_diverged_run_and_leaves_the_healthy_one(auto_server):
    healthy = example(auto_server, "cl/healthy", "--control", "auto")
    faulty = example(auto_server, "cl/diverge", "--control", "auto", "--fault", "diverge")
    healthy_out, faulty_out = finish(healthy), finish(faulty)

    assert auto_server.ctl_json("directives", "--run", "cl/healthy") == []
    directives = auto_server.ctl_json("directives", "--run", "cl/diverge")
    assert len(directives) == 1, directives
    d = directives[0]
    assert (d["action"], d["state"], d["approved_by"]) == ("rollback", "APPLIED", "policy"), d
    assert d["alert"].startswith("LossDivergence@"), d
    assert len(rank_applied(d)) == 1, d["transitions"]  # applied once
    # The fault's batches (those of steps 250..254) are among those skipped,
    # and the replay never trained on them.
    fault_line = [m for m in re.finditer(r"FAULT diverge step=(\d+)", faulty_out)]
    assert [int(m.group(1)) for m in fault_line] == list(range(250, 255)), faulty_out
    assert d["rollback"]["to_step"] <= 150 and len(d["rollback"]["skip_batch_ids"]) >= 40
    (applied,) = applied_steps(faulty_out)
    assert applied[0] == d["id"] and applied[1] == applied[2] == d["apply_at_step"]
    alert_step = int(d["alert"].split("@")[1])
    print(f"FIGURES alert_step={alert_step} applied_at={applied[1]} "
          f"alert_to_applied={applied[1] - alert_step} to_step={d['rollback']['to_step']} "
          f"steps_lost={applied[1] - d['rollback']['to_step']} "
          f"skipped_ids={len(d['rollback']['skip_batch_ids'])}")
    assert applied[1] - alert_step <= 2 + 1 + 5, (alert_step, applied)  # lead_steps 2
    assert "control: applied 1 directives" in faulty_out
    assert "control: applied 0 directives" in healthy_out

    h, f = final_loss(healthy_out), final_loss(faulty_out)
    print(f"FIGURES healthy_final={h} rolled_back_final={f}")
    assert abs(f - h) <= 0.1 * h, (h, f)
    runs = {r["run_id"]: r for r in auto_server.ctl_json("runs")}
    assert runs["cl/diverge"]["attempt"] == 1 and runs["cl/healthy"]["attempt"] == 0


def test_propose_applies_nothing_until_approved_and_a_second_approval_is_a_no_op(tmp_path):
    server = Server(tmp_path, ["--config", config(tmp_path, "propose")])
    try:
        run = "cl/propose"
        proc = example(server, run, "--control", "propose", "--fault", "diverge")
        d = poll("a proposal", lambda: server.ctl_json("directives", "--run", run), 400)[0]
        assert d["state"] == "PROPOSED", d
        alert_step = int(d["alert"].split("@")[1])
        # The trainer goes on 30 steps past the alert: nothing reaches it.
        poll("30 more steps", lambda: any(
            r["run_id"] == run and r["steps"] > alert_step + 30
            for r in server.ctl_json("runs")))
        d = server.ctl_json("directives", "--run", run)[0]
        assert d["state"] == "PROPOSED" and not rank_applied(d), d

        server.ctl("approve", d["id"], "--note", "looked at it")
        server.ctl("approve", d["id"])  # a duplicate approval: a no-op
        again = server.ctl_json("directives", "--run", run)[0]
        assert [t["state"] for t in again["transitions"]].count("APPROVED") == 1, again

        out = finish(proc)
        final = server.ctl_json("directives", "--run", run)
        assert len(final) == 1 and final[0]["state"] == "APPLIED", final
        assert len(rank_applied(final[0])) == 1
        assert len(applied_steps(out)) == 1, out
        assert applied_steps(out)[0][1] > alert_step + 30
    finally:
        server.stop()


class FakeClient:
    """Stands in for trainwatch.Client: delivers given directives."""

    def __init__(self, directives, attempt=0):
        self.directives = directives
        self.attempt = attempt
        self.acks = []
        self.events = []

    def due_directives(self, step):
        answered = {i for i, s, _ in self.acks if s != "received"}
        return [d for d in self.directives
                if d["apply_at_step"] <= step and d["id"] not in answered]

    def ack_directive(self, id, state, detail=""):
        self.acks.append((id, state, detail))
        return True

    def event(self, kind, step, detail=""):
        self.events.append((kind, step, detail))

    def flush(self, timeout=0):
        pass

    def close(self, timeout=0):
        pass

    def new_attempt(self, last_applied_directive=0):
        return FakeClient([], self.attempt + 1)


ROLLBACK = {"id": "r#1", "seq": 1, "for_attempt": 0, "apply_at_step": 10, "alert": "A@8",
            "reason": "", "approved_by": "policy", "action": "rollback",
            "rollback": {"to_step": 3, "checkpoint": "c3", "skip_batch_ids": [7, 8],
                         "lr_scale": 0.9}}


def test_a_directive_is_applied_once_across_a_restart():
    loads, scales = [], []
    tw = FakeClient([ROLLBACK])
    c = trainwatch.Control(tw, load=lambda s, n: loads.append((s, n)),
                           set_lr_scale=scales.append)
    assert not c.boundary(9)
    b = c.boundary(10)
    assert b.rollback["id"] == "r#1" and b.resume_step == 4
    assert loads == [(3, "c3")] and scales == [0.9] and c.skip_ids == {7, 8}
    assert ("r#1", "applied", "") in tw.acks and c.tw.attempt == 1
    state = c.state_dict()
    assert state["last_applied_seq"] == 1 and state["applied_ids"] == ["r#1"]

    # A new process restored from that state gets the directive again.
    tw2 = FakeClient([ROLLBACK], attempt=1)
    c2 = trainwatch.Control(tw2, load=lambda s, n: loads.append((s, n)),
                            set_lr_scale=scales.append)
    c2.load_state_dict(state)
    assert not c2.boundary(10)
    assert loads == [(3, "c3")] and scales == [0.9]  # not applied twice
    assert tw2.acks == [("r#1", "applied", "already applied")]
    assert list(c2.filter([(0, [1, 2]), (1, [7, 9]), (2, [3])])) == [(0, [1, 2]), (2, [3])]
    # A late one is answered "late", never applied.
    late = dict(ROLLBACK, id="r#2", seq=2)
    c3 = trainwatch.Control(FakeClient([late]), load=lambda s, n: loads.append((s, n)))
    assert not c3.boundary(12)
    assert c3.tw.acks[0][1] == "rejected" and c3.tw.acks[0][2].startswith("late")


def test_a_rollback_without_a_load_callback_exits_75_and_the_restart_resumes_it(tmp_path):
    """Where the loop cannot roll back in process (no `load`), the rollback
    is acked APPLIED, its resume point written to restart_file, and the
    process exits with EXIT_RESTART (75) for the launcher; the restarted
    process reads it back and never applies the directive again."""
    restart = tmp_path / "restart.json"
    tw = FakeClient([ROLLBACK])
    c = trainwatch.Control(tw, restart_file=restart)
    with pytest.raises(SystemExit) as exit_:
        c.boundary(10)
    assert exit_.value.code == trainwatch.EXIT_RESTART == 75
    assert ("r#1", "applied", "") in tw.acks
    state = trainwatch.Control.read_restart_file(restart)
    assert state["resume"] == {"to_step": 3, "checkpoint": "c3", "lr_scale": 0.9}
    assert state["last_applied_seq"] == 1 and set(state["skip_batch_ids"]) == {7, 8}

    tw2 = FakeClient([ROLLBACK], attempt=1)  # delivered again after the restart
    c2 = trainwatch.Control(tw2, restart_file=restart)
    c2.load_state_dict(state)
    assert not c2.boundary(10)
    assert tw2.acks == [("r#1", "applied", "already applied")]


class DropAppliedAcks:
    """A real client whose APPLIED acks are lost: the trainer died after
    applying a directive and before its ack left."""

    def __init__(self, tw):
        self._tw = tw

    def ack_directive(self, id, state, detail=""):
        return state == "applied" or self._tw.ack_directive(id, state, detail)

    def __getattr__(self, name):
        return getattr(self._tw, name)


def test_a_restart_restored_from_the_state_never_applies_it_twice(tmp_path):
    """Real server (propose, approved by hand): a rollback applied whose ack
    was lost; the restarted client passes the restored seq as
    RunStart.last_applied_directive and is not sent it again; a client that
    is sent it again (no seq passed) answers APPLIED without applying it."""
    server = Server(tmp_path, ["--config", config(tmp_path, "propose")])
    try:
        run = "cl/restored"
        never = lambda s, n: pytest.fail("applied twice")  # noqa: E731
        # NaN at step 150 after a checkpoint at 20: a critical NonFiniteUpdate.
        with trainwatch.Client(server.address, run=run, max_norm=1.0) as tw:
            tw.event("checkpoint_saved", 20, "c20")
            for s in range(160):
                tw.record(s, grad_norm=float("nan") if s == 150 else 0.5, loss=2.0,
                          batch_ids=[2 * s, 2 * s + 1])
            tw.flush()
            d = poll("a proposal", lambda: server.ctl_json("directives", "--run", run))[0]
            server.ctl("approve", d["id"])
            loads = []
            c = trainwatch.Control(DropAppliedAcks(tw), load=lambda s, n: loads.append(n),
                                   reopen=False)
            step = 160

            def applied():
                nonlocal step
                tw.record(step, grad_norm=0.5, loss=2.0)
                tw.flush()
                b = c.boundary(step)
                step += 1
                return b.rollback
            poll("the rollback", applied, 60)
            assert loads == ["c20"]
            state = c.state_dict()
        (d,) = server.ctl_json("directives", "--run", run)
        assert d["state"] == "DELIVERED" and not rank_applied(d), d

        with trainwatch.Client(server.address, run=run, max_norm=1.0, attempt=1,
                               last_applied_directive=state["last_applied_seq"]) as tw:
            c = trainwatch.Control(tw, load=never)
            c.load_state_dict(state)
            for s in range(200, 220):
                tw.record(s, grad_norm=0.5, loss=2.0)
                tw.flush()  # the responses, and any directive on them, are in
                assert not tw.due_directives(s) and not c.boundary(s)

        with trainwatch.Client(server.address, run=run, max_norm=1.0, attempt=2) as tw:
            c = trainwatch.Control(tw, load=never)
            c.load_state_dict(state)
            step = 300

            def answered():
                nonlocal step
                tw.record(step, grad_norm=0.5, loss=2.0)
                tw.flush()
                due = tw.due_directives(step)
                assert not c.boundary(step)
                step += 1
                return due
            assert poll("the directive again", answered, 60)[0]["id"] == d["id"]
            tw.flush()
        d = poll("APPLIED", lambda: [x for x in server.ctl_json("directives", "--run", run)
                                     if x["state"] == "APPLIED"])[0]
        assert len(rank_applied(d)) == 1, d
    finally:
        server.stop()


def _rank_main(rank, address, run, store, steps, out):
    """One gloo rank of a tiny data-parallel regression: the batch whose ids
    hold 2 * 150 makes the gradients NaN (NonFiniteUpdate, critical)."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = torch.randn(8, 1)
    checkpoints, position = {}, {"next": 0}
    tw = trainwatch.Client(address, run=run, rank=rank, world_size=2, max_norm=10.0)

    def load(step, name):
        model.load_state_dict(checkpoints[name]["model"])
        opt.load_state_dict(checkpoints[name]["opt"])
        position["next"] = checkpoints[name]["next"]

    control = trainwatch.Control(tw, load=load)
    # Batch i holds samples 2i and 2i + 1, one per rank; each rank reports
    # both (the lead rank's ids are the ones a rollback skips).
    batches = control.filter((i, [2 * i, 2 * i + 1]) for i in range(10 ** 6))
    step, applied = 0, []
    while step < steps:
        index, ids = next(batches)
        position["next"] = index + 1
        g = torch.Generator().manual_seed(ids[rank])
        x = torch.randn(16, 8, generator=g)
        loss = ((model(x) - x @ w) ** 2).mean()
        if index == 150:
            loss = loss * float("nan")
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        b = control.boundary(step)
        if b.rollback:
            applied.append((b.rollback["id"], step, b.rollback["apply_at_step"]))
            opt.zero_grad()
            tw, step = control.tw, b.resume_step
            start = position["next"]
            batches = control.filter((i, [2 * i, 2 * i + 1]) for i in range(start, 10 ** 6))
            continue
        opt.step()
        opt.zero_grad()
        tw.record(step, grad_norm=norm, loss=loss, batch_ids=ids)
        if step % 50 == 0 and step > 0:
            checkpoints[f"c{step}"] = {"model": {k: v.clone() for k, v in
                                                 model.state_dict().items()},
                                       "opt": opt.state_dict(), "next": index + 1}
            tw.event("checkpoint_saved", step, f"c{step}")
        step += 1
    tw.close()
    with open(out, "w") as f:
        f.write(repr({"applied": applied, "log": control.log}))
    dist.destroy_process_group()


def test_two_gloo_ranks_apply_the_rollback_at_the_same_step(tmp_path):
    # A loop of ~2 ms a step runs ahead of what the server has seen; a lead
    # of 40 steps gives every rank time to receive the directive first.
    server = Server(tmp_path, ["--config", config(tmp_path, "auto", lead_steps=40)])
    try:
        import torch.multiprocessing as mp
        run = "cl/two-ranks"
        outs = [tmp_path / f"rank{r}.txt" for r in range(2)]
        ctx = mp.spawn(_rank_wrapper, args=(server.address, run, str(tmp_path / "store"),
                                            400, [str(o) for o in outs]),
                       nprocs=2, join=False)
        deadline = time.monotonic() + 300
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "the ranks did not finish"
        results = [eval(o.read_text()) for o in outs]
        assert results[0]["applied"] == results[1]["applied"], results
        (applied,) = results[0]["applied"]
        assert applied[1] == applied[2]  # at its apply_at_step on both
        (d,) = server.ctl_json("directives", "--run", run)
        assert d["state"] == "APPLIED" and d["alert"] == "NonFiniteUpdate@150", d
        assert sorted(t["who"] for t in rank_applied(d)) == ["rank 0", "rank 1"]
    finally:
        server.stop()


def _rank_wrapper(rank, address, run, store, steps, outs):
    _rank_main(rank, address, run, store, steps, outs[rank])



# -- a tiny single-rank loop, stepped one step at a time ------------------------

BAD = 0  # the first token of the corrupt document (real tokens are 1..999)
LR = 0.05


class Tiny:
    """A tiny PyTorch regression on CPU wired to the closed loop as
    docs/closed-loop.md says, stepped by step(): batch i (ids [i]) holds
    tokens and inputs generated from i; a checkpoint (model, optimizer, data
    position, Control.state_dict()) every 50 steps, kept in memory and, with
    ckpt_dir, on disk. Faults:
      poison: batch ids whose first token is BAD (the same corrupt document
          at several places of the corpus); the step of any batch whose
          first token is BAD has a non-finite loss, whatever its id.
      glitch: (attempt, step) whose reported gradient norm is NaN (a
          transient fault: the data and the update are fine, and it does
          not come back)."""

    def __init__(self, tw, poison=(), glitch=None, report_ids=True, ckpt_dir=None,
                 resume=None):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.w = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
        self.poison, self.glitch, self.report_ids = set(poison), glitch, report_ids
        self.ckpt_dir = ckpt_dir
        self.checkpoints = {}
        self.losses = []  # (attempt, step, loss)
        self.loads, self.scales, self.stops, self.bad_steps = [], [], [], []
        self.tw = tw
        self.control = trainwatch.Control(tw, save=self.save, load=self.load,
                                          set_lr_scale=self.set_lr_scale,
                                          stop=lambda: self.stops.append(self.step))
        self.step, self.next = 0, 0
        if resume is not None:
            self._restore(resume)
            self.control.load_state_dict(resume["control"])
            self.step = resume["step"] + 1
        self.batches = self.control.filter((i, [i]) for i in range(self.next, 10 ** 6))

    def data(self, i):
        g = torch.Generator().manual_seed(i)
        tokens = torch.randint(1, 1000, (4,), generator=g)
        if i in self.poison:
            tokens[0] = BAD
        return tokens, torch.randn(16, 8, generator=g)

    def state(self):
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "opt": self.opt.state_dict(), "next": self.next, "step": self.step,
                "control": self.control.state_dict()}

    def _restore(self, state):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.next = state["next"]

    def save(self, tag):
        state = self.state()
        self.checkpoints[tag] = state
        if self.ckpt_dir is not None:
            torch.save(state, os.path.join(self.ckpt_dir, tag + ".pt"))
            with open(os.path.join(self.ckpt_dir, "latest.tmp"), "w") as f:
                f.write(tag)
            os.replace(os.path.join(self.ckpt_dir, "latest.tmp"),
                       os.path.join(self.ckpt_dir, "latest"))

    def load(self, step, name):
        state = self.checkpoints.get(name)
        if state is None:  # saved by an earlier process
            state = torch.load(os.path.join(self.ckpt_dir, name + ".pt"), weights_only=False)
        assert state["step"] == step, (name, state["step"], step)
        self._restore(state)
        self.loads.append(name)

    def set_lr_scale(self, factor):
        self.scales.append(factor)
        for g in self.opt.param_groups:
            g["lr"] *= factor

    def run(self, n=1):
        """n steps, or fewer when a Stop ends the loop; the last Boundary."""
        b = None
        for _ in range(n):
            b = self.train_step()
            if b.stop:
                break
        return b

    def train_step(self):
        index, ids = next(self.batches)
        self.next = index + 1
        tokens, x = self.data(index)
        loss = ((self.model(x) - x @ self.w) ** 2).mean()
        if int(tokens[0]) == BAD:
            loss = loss * float("nan")
            self.bad_steps.append((self.tw.attempt, self.step))
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0))
        reported = float("nan") if self.glitch == (self.tw.attempt, self.step) else norm
        b = self.control.boundary(self.step)
        if b:
            self.opt.zero_grad()
        if b.rollback:
            self.tw, self.step = self.control.tw, b.resume_step
            self.batches = self.control.filter((i, [i]) for i in range(self.next, 10 ** 6))
            return b
        if b.stop:
            return b
        self.opt.step()  # a non-finite one too: the rollback undoes it
        self.opt.zero_grad()
        self.losses.append((self.tw.attempt, self.step, loss.item()))
        self.tw.record(self.step, grad_norm=reported, loss=loss.item(),
                       batch_ids=ids if self.report_ids else None)
        if self.step % 50 == 0:
            tag = f"a{self.tw.attempt}-c{self.step}"
            self.save(tag)
            self.tw.event("checkpoint_saved", self.step, tag)
        # In step with the server: each step's responses, and the directives
        # on them, are in before the next step.
        self.tw.flush(timeout=30)
        self.step += 1
        return b

    def until(self, what, fn, max_steps=600):
        """Steps until fn() is truthy (checked before each step)."""
        for _ in range(max_steps):
            v = fn()
            if v:
                return v
            if self.train_step().stop:
                break
        v = fn()
        assert v, f"{what}: not within {max_steps} steps"
        return v

    def received(self):
        """The directives this client holds and has not answered, due or
        not (a peek: due_directives of a step past any apply_at_step)."""
        return self.tw.due_directives(10 ** 9)


def directives(server, run):
    return server.ctl_json("directives", "--run", run)


def restart(server, tmp_path, args):
    """A new trainwatch-server on the same --db and gRPC address."""
    return Server(tmp_path, [*args, "--listen", server.address])


def test_a_server_killed_between_delivery_and_application_still_applies_it_once(tmp_path):
    """The directive reaches the trainer (RANK_RECEIVED), the server is
    SIGKILLed and restarted on the same --db before its apply_at_step; the
    trainer applies it once at that step, and the record shows it APPLIED
    with one RANK_APPLIED."""
    args = ["--config", config(tmp_path, "auto", lead_steps=20)]
    server = Server(tmp_path, args)
    run = "cl/server-killed"
    try:
        t = Tiny(trainwatch.Client(server.address, run=run, max_norm=10.0), glitch=(0, 150))
        (d,) = t.until("the rollback received", t.received, 300)
        step_received = t.step
        t.run(1)  # its RECEIVED ack rides on this step's batch, flushed
        assert t.step < d["apply_at_step"]
        poll("RANK_RECEIVED", lambda: any(tr["state"] == "RANK_RECEIVED"
                                          for tr in directives(server, run)[0]["transitions"]))
        pid = server.proc.pid
        server.proc.kill()  # SIGKILL, the server this test started
        server.proc.wait(timeout=10)
        server.stop()
        server = restart(server, tmp_path, args)
        assert server.proc.pid != pid
        (back,) = directives(server, run)
        assert back["state"] == "DELIVERED" and not rank_applied(back), back
        assert t.loads == []

        t.until("the rollback applied", lambda: t.loads, 100)
        assert t.control.log == [(d["id"], d["apply_at_step"], d["apply_at_step"])], t.control.log
        assert d["apply_at_step"] > step_received
        t.run(30)  # and on: it is not applied again
        t.tw.close(timeout=30)
        final = poll("APPLIED", lambda: [x for x in directives(server, run)
                                         if x["state"] == "APPLIED"])
        assert len(directives(server, run)) == 1
        assert len(rank_applied(final[0])) == 1, final[0]["transitions"]
        assert t.loads == [d["rollback"]["checkpoint"]] and len(t.control.log) == 1
    finally:
        server.stop()


def _trainer_process(address, run, ckpt_dir, out, steps):
    """test_a_rank_killed_...'s trainer: from the latest checkpoint in
    ckpt_dir when there is one (Control.load_state_dict, and the Client
    opened as attempt + 1 with RunStart.last_applied_directive), else from
    scratch with a NaN gradient norm reported at step 150. Attempt 0 stops
    once it holds a directive (RECEIVED acked and flushed), writes
    received.json and waits to be killed."""
    resume = None
    latest = os.path.join(ckpt_dir, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            resume = torch.load(os.path.join(ckpt_dir, f.read() + ".pt"), weights_only=False)
    attempt = 0 if resume is None else resume["control"]["attempt"] + 1
    last = 0 if resume is None else resume["control"]["last_applied_seq"]
    tw = trainwatch.Client(address, run=run, max_norm=10.0, attempt=attempt,
                           last_applied_directive=last)
    t = Tiny(tw, glitch=(0, 150), ckpt_dir=ckpt_dir, resume=resume)
    while t.step < steps:
        t.train_step()
        if attempt == 0 and t.received():
            t.run(1)  # the RECEIVED ack goes with this step's batch
            with open(os.path.join(ckpt_dir, "received.tmp"), "w") as f:
                json.dump({"directive": t.received()[0], "step": t.step}, f)
            os.replace(os.path.join(ckpt_dir, "received.tmp"),
                       os.path.join(ckpt_dir, "received.json"))
            while True:  # hung until killed
                time.sleep(1)
    t.tw.close(timeout=30)
    with open(out, "w") as f:
        json.dump({"loads": t.loads, "log": t.control.log, "first_step": resume["step"] + 1
                   if resume else 0, "attempt": attempt}, f)


def test_a_rank_killed_between_received_and_applied_applies_it_once_overall(tmp_path):
    """The trainer holds the directive (RANK_RECEIVED) and is SIGKILLed
    before its apply_at_step; restarted from its last checkpoint it is sent
    the directive again and applies it once at the same step: one
    RANK_APPLIED, one load() over both processes."""
    server = Server(tmp_path, ["--config", config(tmp_path, "auto", lead_steps=20)])
    run = "cl/rank-killed"
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    out = tmp_path / "trainer.json"
    cmd = [sys.executable, __file__, "trainer", server.address, run, str(ckpt_dir), str(out),
           "260"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(trainwatch.__path__[0]),
                                           os.environ.get("PYTHONPATH", "")]))
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
    try:
        marker = ckpt_dir / "received.json"
        poll("the trainer to hold the directive",
             lambda: marker.exists() or first.poll() is not None, 300)
        assert first.poll() is None, first.communicate()[0]
        received = json.loads(marker.read_text())
        d = received["directive"]
        assert received["step"] < d["apply_at_step"]
        poll("RANK_RECEIVED", lambda: any(tr["state"] == "RANK_RECEIVED"
                                          for tr in directives(server, run)[0]["transitions"]))
        first.kill()  # SIGKILL, the process this test started
        first.communicate(timeout=30)
        (held,) = directives(server, run)
        assert held["state"] == "DELIVERED" and not rank_applied(held), held

        second = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, timeout=300)
        assert second.returncode == 0, second.stdout
        result = json.loads(out.read_text())
        assert result["attempt"] == 1 and result["first_step"] <= received["step"], result
        assert result["loads"] == [d["rollback"]["checkpoint"]], result
        assert result["log"] == [[d["id"], d["apply_at_step"], d["apply_at_step"]]], result
        final = poll("APPLIED", lambda: [x for x in directives(server, run)
                                         if x["state"] == "APPLIED"])
        assert len(directives(server, run)) == 1
        assert len(rank_applied(final[0])) == 1, final[0]["transitions"]
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
        server.stop()


def test_a_rollback_with_an_empty_skip_list_replays_the_run_bit_for_bit(auto_server):
    """A transient fault (a NaN gradient norm reported at step 150; the data
    is fine) in a run that reports no batch ids: the policy's rollback
    skips nothing, and from its checkpoint on the replay's losses are the
    uninterrupted run's, bit for bit: the model, the optimizer and the data
    position were restored."""
    healthy = Tiny(trainwatch.Client(auto_server.address, run="cl/bits-healthy", max_norm=10.0),
                   report_ids=False)
    healthy.run(260)
    faulty = Tiny(trainwatch.Client(auto_server.address, run="cl/bits", max_norm=10.0),
                  report_ids=False, glitch=(0, 150))
    faulty.until("the rollback", lambda: faulty.loads, 300)
    faulty.until("the end", lambda: faulty.step >= 260, 300)
    for t in (healthy, faulty):
        t.tw.close(timeout=30)
    assert directives(auto_server, "cl/bits-healthy") == []
    (d,) = directives(auto_server, "cl/bits")
    assert d["action"] == "rollback" and d["alert"] == "NonFiniteUpdate@150", d
    assert d["rollback"].get("skip_batch_ids", []) == [], d
    to_step = d["rollback"]["to_step"]
    assert to_step <= 50
    assert faulty.control.skip_ids == set() and faulty.control.skipped == 0
    expected = {s: loss for _, s, loss in healthy.losses}
    replay = [(s, loss) for a, s, loss in faulty.losses if a == 1]
    assert [s for s, _ in replay] == list(range(to_step + 1, 260))
    assert [loss for _, loss in replay] == [expected[s] for s, _ in replay]
    # The attempt before the rollback also matched, up to its fault.
    assert all(expected[s] == loss for a, s, loss in faulty.losses if a == 0)


def test_a_fault_in_the_data_comes_back_and_climbs_the_ladder_to_a_stop(tmp_path):
    """The same corrupt document at batch ids 160, 280, 400, 520, 640 (the
    fault is keyed to its first token, not to the ids): each rollback skips
    the ids it saw and the next copy trips it again: rollbacks at LR x 1.0,
    0.9, 0.67 (closed_loop.max_rollbacks 3), then a Stop, and the trainer's
    stop() ran.

    The copies are 120 ids apart, so that each attempt meets exactly one
    (the ladder's skips are then known). A copy met soon after a restart is
    an alert of its own too: the restart resolves the alerts of the steps it
    abandoned (RunPipelineTest.AFaultThatComesBackAfterARestartIsAnAlertOfItsOwn)."""
    server = Server(tmp_path, ["--config", config(
        tmp_path, "auto", auto="checkpoint_now, skip, rollback, stop", max_rollbacks=3)])
    run = "cl/ladder"
    try:
        t = Tiny(trainwatch.Client(server.address, run=run, max_norm=10.0),
                 poison=range(160, 700, 120))
        t.until("the stop", lambda: t.stops, 1500)
        t.tw.close(timeout=30)
        ds = directives(server, run)
        assert [d["action"] for d in ds] == ["rollback"] * 3 + ["stop"], ds
        assert all(d["state"] == "APPLIED" and len(rank_applied(d)) == 1 for d in ds), ds
        assert [d["rollback"].get("lr_scale", 1.0) for d in ds[:3]] == pytest.approx(
            [1.0, 0.9, 0.67]), ds
        assert [d["for_attempt"] for d in ds] == [0, 1, 2, 3]
        assert all(d["alert"].startswith("NonFiniteUpdate@") for d in ds), ds
        assert "max_rollbacks" in ds[3]["reason"], ds[3]
        # The fault came back once per attempt, each time on another batch id.
        assert [a for a, _ in t.bad_steps] == [0, 1, 2, 3], t.bad_steps
        assert t.scales == pytest.approx([0.9, 0.67]) and len(t.loads) == 3
        assert len(t.stops) == 1 and t.control.log[-1][0] == ds[3]["id"]
        skipped = set().union(*(d["rollback"]["skip_batch_ids"] for d in ds[:3]))
        assert {160, 280, 400} <= skipped and 520 not in skipped
        # The ladder ran out: a person is paged by name, caused by the alert
        # that kept coming back.
        exhausted = [a for a in server.ctl_json("alerts", "--run", run)
                     if a["alertname"] == "ClosedLoopExhausted"]
        assert len(exhausted) == 1, exhausted
        assert exhausted[0]["severity"] == "critical", exhausted
        assert exhausted[0]["caused_by"] == "NonFiniteUpdate", exhausted
        assert "max_rollbacks" in exhausted[0]["description"], exhausted
    finally:
        server.stop()


def test_a_hold_blocks_auto_until_released(auto_server):
    """`trainwatchctl hold --run R --for 1h` before the fault: the rollback
    stays PROPOSED and nothing is applied while the trainer goes on;
    `release --run R` lets the policy approve it and the trainer apply it."""
    run = "cl/held"
    t = Tiny(trainwatch.Client(auto_server.address, run=run, max_norm=10.0), glitch=(0, 150))
    t.run(10)
    auto_server.ctl("hold", "--run", run, "--for", "1h")
    (d,) = t.until("a proposal", lambda: directives(auto_server, run), 300)
    assert d["state"] == "PROPOSED" and d["alert"] == "NonFiniteUpdate@150", d
    t.run(40)  # 40 steps past the alert: lead_steps 2 would have applied it
    (d,) = directives(auto_server, run)
    assert d["state"] == "PROPOSED" and not rank_applied(d), d
    assert t.loads == [] and t.received() == [] and t.control.log == []

    auto_server.ctl("release", "--run", run)
    t.until("the rollback applied", lambda: t.loads, 100)
    t.run(10)
    t.tw.close(timeout=30)
    (d,) = directives(auto_server, run)
    assert (d["state"], d["approved_by"]) == ("APPLIED", "policy"), d
    assert len(rank_applied(d)) == 1 and len(t.loads) == 1
    states = [tr["state"] for tr in d["transitions"]]
    assert states.index("PROPOSED") < states.index("APPROVED"), states


if __name__ == "__main__" and sys.argv[1] == "trainer":
    _trainer_process(*sys.argv[2:6], int(sys.argv[6]))
