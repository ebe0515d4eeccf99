"""trainwatchctl import, end to end against the real server.

- The real event files of the shared test data import with every logged
  grad-norm, loss and LR point, checked point by point against
  tfrecord_reader.py (an independent decoder).
- Hugging Face trainer_state.json runs: a norm above max_grad_norm on most
  points raises ClipFractionHigh; a healthy control raises nothing that
  pages; a NaN-from-the-start run is named (NonFiniteUpdate) at its first
  step; an fp16 log without a loss scale raises no Fp16WithoutScaler.
- Bad files: a corrupt event file names the offset and sends nothing; a
  truncated one is reported and imported.
"""

import json
import math
import random
import shutil
import subprocess

import pytest

from conftest import BIN_DIR, SHARED_DIR
import tfrecord_reader

TB_DIR = SHARED_DIR / "testdata" / "tensorboard"


def shared_file(name):
    """A real event file of the shared test data; skips the test, saying
    why, in a checkout that does not have it beside it."""
    path = TB_DIR / name
    if not path.exists():
        pytest.skip(f"needs the shared test data ({path}), which this checkout "
                    "does not have beside it (or set TRAINWATCH_SHARED_DIR)")
    return path

# Per file, the tags that carry grad norm, loss and LR (from SOURCES.md, not
# from trainwatch's tag table).
TB_FILES = {
    "fyh2001__megatron-sft-recipes__events.out.tfevents.1777063938.am4g1r39bm1.146032.0":
        ("train/grad_norm", "train/loss", "train/learning_rate"),
    "fyh2001__megatron-sft-recipes__events.out.tfevents.1777068747.am4g1r39bm1.153799.0":
        ("train/grad_norm", "train/loss", "train/learning_rate"),
    "anra8571__WikipediaLLM__events.out.tfevents.1755815213.Cerebro.18280.1":
        ("train/grad_norm", "train/loss", "train/learning_rate"),
    "elena-lyulina__Megatron-LM-Attention-Benchmark__events.out.tfevents.1776244695.nid007435.275938.0":
        ("grad-norm", "lm loss", "learning-rate"),
    "vaibhav016__gpt-neox__events.out.tfevents.1713400761.cn-g026.server.mila.quebec.1935776.0":
        (None, "train/lm_loss", "train/learning_rate"),
    "CarlSchader__labeled-contrastive-framework__events.out.tfevents.1713773043.carls-gaming-linux.286970.0":
        (None, "train_loss", None),
}


def ctl(server, *args, check=True):
    r = subprocess.run([str(BIN_DIR / "trainwatchctl"), "--server", server.address, *args],
                       capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"trainwatchctl {' '.join(args)} exited {r.returncode}:\n"
                             f"{r.stderr}{r.stdout}")
    return r


def steps_of(server, run):
    return json.loads(ctl(server, "steps", "--run", run, "--json").stdout)


def alerts_of(server, run):
    return json.loads(ctl(server, "alerts", "--run", run, "--json").stdout)


def series(points, tag):
    """step -> value of one tag; a later point for a step wins."""
    out = {}
    for t, step, value in points:
        if t == tag:
            out[step] = value
    return out


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("name", sorted(TB_FILES))
def test_real_event_file_imports_every_point(server, name):
    path = shared_file(name)
    grad_tag, loss_tag, lr_tag = TB_FILES[name]
    points = tfrecord_reader.scalars(path)
    run = "tb-" + name.split("__")[0]
    out = ctl(server, "import", str(path), "--run", run).stdout
    assert f"to run {run}" in out
    records = {r["step"]: r for r in steps_of(server, run)}

    if grad_tag is not None:
        norms = series(points, grad_tag)
        assert norms, grad_tag
        assert {s for s, r in records.items()} == set(norms)
        for step, value in norms.items():
            assert same(records[step]["grad_norm"], value), step
    else:
        assert "grad norm: none usable" in out
    for tag, field in ((loss_tag, "loss"), (lr_tag, "lr")):
        if tag is None:
            continue
        expected = series(points, tag)
        got = {s: r[field] for s, r in records.items() if field in r}
        assert set(got) == set(expected), (tag, len(got), len(expected))
        for step, value in expected.items():
            assert same(float(got[step]), value), (tag, step)


def hf_state(points, logging_steps=1, extra_eval=True):
    """A trainer_state.json of (step, grad_norm, loss, lr) points, with eval
    entries and the final summary entry the Trainer writes."""
    history = []
    for step, norm, loss, lr in points:
        history.append({"epoch": step / 1000, "grad_norm": norm, "learning_rate": lr,
                        "loss": loss, "step": step})
        if extra_eval and step % 100 == 0:
            history.append({"epoch": step / 1000, "eval_loss": loss + 0.1,
                            "eval_runtime": 3.2, "step": step})
    last = points[-1][0]
    history.append({"epoch": 1.0, "step": last, "total_flos": 1e15, "train_loss": 2.0,
                    "train_runtime": 1000.0})
    # json.dumps writes NaN and Infinity bare, as the Trainer's state does.
    return json.dumps({"global_step": last, "logging_steps": logging_steps,
                       "log_history": history}, indent=2)


def lr_at(step, total, warmup=100, peak=5e-5):
    if step <= warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / (total - warmup))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def paging(alerts):
    return [a for a in alerts if a["severity"] in ("warning", "critical")]


def test_hf_norm_above_max_grad_norm_raises_clip_fraction_high(server, tmp_path):
    rnd = random.Random(1)
    total = 3000
    # Logged every 10 steps: the windows hold logged points.
    points = [(s, math.exp(rnd.gauss(math.log(2.4), 0.35)), 2.0 - s / 5000 + rnd.gauss(0, 0.02),
               lr_at(s, total)) for s in range(10, total + 1, 10)]
    above = sum(1 for p in points if p[1] > 1.0) / len(points)
    assert above > 0.9
    path = write(tmp_path, "trainer_state.json", hf_state(points, logging_steps=10))
    out = ctl(server, "import", str(path), "--run", "hf-clip").stdout
    assert "max_norm: 1.0, the Hugging Face Trainer's default" in out
    assert "warmup: 100 steps, inferred from the LR ramp" in out
    assert "one point every 10 steps" in out
    names = {a["alertname"] for a in alerts_of(server, "hf-clip")}
    assert "ClipFractionHigh" in names
    health = ctl(server, "health", "--run", "hf-clip").stdout
    assert "logged every 10 steps" in health


def test_hf_healthy_control_pages_nothing(server, tmp_path):
    rnd = random.Random(2)
    total = 1500
    points = []
    for s in range(1, total + 1):
        norm = math.exp(rnd.gauss(math.log(0.35), 0.15))
        loss = 2.5 * math.exp(-s / 3000) + rnd.gauss(0, 0.01)
        points.append((s, norm, loss, lr_at(s, total)))
    assert max(p[1] for p in points) < 1.0
    path = write(tmp_path, "trainer_state.json", hf_state(points))
    ctl(server, "import", str(path), "--run", "hf-ok")
    alerts = alerts_of(server, "hf-ok")
    assert paging(alerts) == [], alerts
    runs = ctl(server, "runs").stdout
    assert "hf-ok" in runs and "finished" in runs


def test_hf_nan_from_the_start_is_named_at_its_first_step(server, tmp_path):
    total = 200
    points = [(s, float("nan"), float("nan"), lr_at(s, total, warmup=20))
              for s in range(5, total + 1, 5)]
    path = write(tmp_path, "trainer_state.json", hf_state(points, logging_steps=5))
    out = ctl(server, "import", str(path), "--run", "hf-nan").stdout
    assert "did not recover" in out
    nonfinite = [a for a in alerts_of(server, "hf-nan") if a["alertname"] == "NonFiniteUpdate"]
    assert nonfinite
    assert min(a["started_step"] for a in nonfinite) == 5


def test_hf_fp16_without_a_logged_scale(server, tmp_path):
    rnd = random.Random(3)
    total = 600
    points = []
    for s in range(1, total + 1):
        # The GradScaler's first steps overflow (inf norm) and are skipped.
        norm = float("inf") if s <= 3 else math.exp(rnd.gauss(math.log(0.4), 0.15))
        points.append((s, norm, 2.0 - s / 2000 + rnd.gauss(0, 0.01), lr_at(s, total, warmup=30)))
    path = write(tmp_path, "trainer_state.json", hf_state(points))
    out = ctl(server, "import", str(path), "--run", "hf-fp16", "--precision", "fp16").stdout
    assert "GradScaler is inferred" in out
    assert "3 logged steps with a non-finite grad norm are read as skipped" in out
    names = {a["alertname"] for a in alerts_of(server, "hf-fp16")}
    assert "Fp16WithoutScaler" not in names
    assert "NonFiniteUpdate" not in names
    skipped = [r["step"] for r in steps_of(server, "hf-fp16") if r.get("skipped")]
    assert skipped == [1, 2, 3]


def test_megatron_stdout(server, tmp_path):
    lines = ["using world size: 8", "> building GPT model ..."]
    for i in range(1, 301):
        if i == 150:
            lines.append("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                         "65536, reducing to 32768")
            lines.append(f" iteration      {i}/    1000 | consumed samples: {i * 512} | elapsed "
                         "time per iteration (ms): 1200.5 | learning rate: 3.000E-04 | global "
                         "batch size:   512 | loss scale: 32768.0 | number of skipped "
                         "iterations:   1 | number of nan iterations:   0 |")
            continue
        scale = 65536.0 if i < 150 else 32768.0
        lines.append(f" iteration      {i}/    1000 | consumed samples: {i * 512} | elapsed "
                     f"time per iteration (ms): 1200.5 | learning rate: {3e-4 * min(1, i / 50):.3E} "
                     f"| global batch size:   512 | lm loss: {8 - i / 100:.6E} | loss scale: "
                     f"{scale} | grad norm: {0.8 + 0.01 * (i % 7):.3f} | number of skipped "
                     "iterations:   0 | number of nan iterations:   0 |")
    path = write(tmp_path, "train.log", "\n".join(lines) + "\n")
    out = ctl(server, "import", str(path), "--run", "mega").stdout
    assert "precision: fp16, inferred from the loss scale" in out
    assert "warmup: 50 steps" in out
    records = {r["step"]: r for r in steps_of(server, "mega")}
    assert len(records) == 300
    assert records[150]["skipped"] is True
    assert records[150]["loss_scale"] == 32768
    assert records[10]["step_time_s"] == pytest.approx(1.2005)
    assert paging(alerts_of(server, "mega")) == []


def test_corrupt_event_file_sends_nothing(server, tmp_path):
    src = shared_file("anra8571__WikipediaLLM__events.out.tfevents.1755815213.Cerebro.18280.1")
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0x20
    bad = tmp_path / "events.out.tfevents.bad"
    bad.write_bytes(bytes(data))
    r = ctl(server, "import", str(bad), "--run", "tb-bad", check=False)
    assert r.returncode == 1
    assert f"{bad}:offset " in r.stderr and "CRC mismatch" in r.stderr
    assert "nothing was sent" in r.stderr
    assert "tb-bad" not in ctl(server, "runs").stdout


def test_truncated_event_file_keeps_the_records_before(server, tmp_path):
    src = shared_file("anra8571__WikipediaLLM__events.out.tfevents.1755815213.Cerebro.18280.1")
    data = src.read_bytes()
    cut = tmp_path / "events.out.tfevents.cut"
    cut.write_bytes(data[:-7])
    out = ctl(server, "import", str(cut), "--run", "tb-cut").stdout
    assert "truncated at offset" in out
    norms = series(tfrecord_reader.scalars(src), "train/grad_norm")
    assert len(steps_of(server, "tb-cut")) == len(norms)


def test_bad_hf_file_names_the_line(server, tmp_path):
    path = write(tmp_path, "trainer_state.json", '{\n "log_history": [\n  {"step": 1, "loss": }\n ]\n}\n')
    r = ctl(server, "import", str(path), "--run", "hf-bad", check=False)
    assert r.returncode == 1
    assert f"{path}:3:" in r.stderr


MOE_DIR = SHARED_DIR / "testdata" / "moe-logs"


def test_real_megatron_moe_runs_import_their_balancing_loss_and_page_nothing(server, tmp_path):
    """The three 64-expert Megatron-Core runs of the shared MoE logs (their
    balancing loss 1.44 -> 1.01 in ~150 iterations): the loss arrives as
    the aggregate MoE layer, and nothing pages."""
    path = MOE_DIR / "megatron_seunghyunseo_lbl.csv"
    if not path.exists():
        pytest.skip(f"needs the shared MoE logs ({path}), which this checkout "
                    "does not have beside it (or set TRAINWATCH_SHARED_DIR)")
    import csv
    runs = {}
    for row in csv.DictReader(path.open()):
        if row["load_balancing_loss"]:
            runs.setdefault(row["run"], []).append(row)
    assert len(runs) >= 2, runs.keys()
    for i, (name, rows) in enumerate(runs.items()):
        text = "iteration,lr,lm_loss,load_balancing_loss,grad_norm\n" + "".join(
            f"{r['iteration']},{r['lr']},{r['lm_loss']},{r['load_balancing_loss']},{r['grad_norm']}\n"
            for r in rows)
        log = write(tmp_path, f"moe{i}.csv", text)
        out = ctl(server, "import", str(log), "--run", f"mega-moe-{i}").stdout
        assert "moe: " in out and "MoeAuxLossOffBalance" in out, out
        records = {r["step"]: r for r in steps_of(server, f"mega-moe-{i}")}
        for r in rows:
            layers = records[int(r["iteration"])]["moe"]["layers"]
            assert layers[0]["aux_loss"] == pytest.approx(float(r["load_balancing_loss"])), name
        assert paging(alerts_of(server, f"mega-moe-{i}")) == [], name


def megatron_moe_log(balancing):
    """Megatron-Core console lines with its load_balancing_loss."""
    lines = []
    for i in range(1, 801):
        lines.append(f" iteration      {i}/    1000 | consumed samples: {i * 512} | elapsed "
                     f"time per iteration (ms): 900.0 | learning rate: {3e-4 * min(1, i / 50):.3E} "
                     f"| global batch size:   512 | lm loss: {8 - i / 200:.6E} | "
                     f"load_balancing_loss: {balancing(i):.6E} | z_loss: {2.5 + 0.01 * (i % 5):.6E} "
                     f"| grad norm: {0.8 + 0.01 * (i % 7):.3f} | number of skipped "
                     "iterations:   0 | number of nan iterations:   0 |")
    return "\n".join(lines) + "\n"


def test_megatron_moe_console_balancing_judged(server, tmp_path):
    healthy = write(tmp_path, "healthy.log", megatron_moe_log(
        lambda i: 1.44 - 0.43 * min(1, i / 150) + 0.005 * (i % 3)))
    ctl(server, "import", str(healthy), "--run", "moe-healthy")
    records = {r["step"]: r for r in steps_of(server, "moe-healthy")}
    assert records[10]["moe"]["layers"][0]["z_loss"] == pytest.approx(2.5)
    assert paging(alerts_of(server, "moe-healthy")) == []
    stuck = write(tmp_path, "stuck.log", megatron_moe_log(lambda i: 1.35 + 0.005 * (i % 3)))
    ctl(server, "import", str(stuck), "--run", "moe-stuck")
    names = {a["alertname"] for a in paging(alerts_of(server, "moe-stuck"))}
    assert names == {"MoeAuxLossOffBalance"}, names
