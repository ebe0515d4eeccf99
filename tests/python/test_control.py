"""The closed loop end to end (docs/closed-loop.md): the real server in
--closed-loop auto or propose, real PyTorch loops on CPU applying its
directives through trainwatch.Control, and trainwatchctl reading the record.

The example's runs (train_tiny_lm.py --fault diverge) take ~600 steps: the
divergence needs a level of 100 losses before it and 50 steps of staying up
after it, and the restart plan a checkpoint 100 steps before its onset."""

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, Server

torch = pytest.importorskip("torch")
import trainwatch  # noqa: E402  (the build's package, found by conftest)

EXAMPLE = REPO / "client" / "examples" / "train_tiny_lm.py"
STEPS = 450


def config(tmp_path, mode, **extra):
    lines = ["closed_loop:", f"  mode: {mode}", "  auto: [checkpoint_now, skip, rollback]"]
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
    """fn()'s first truthy value, polled until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


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
