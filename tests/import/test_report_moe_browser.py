"""The MoE load heatmap of trainwatchctl report, opened in a real browser.

A synthetic MoE step log (four layers of eight experts, top-2: layer 2
collapses onto experts 1 and 6 from step 300, expert 5 of layer 0 never gets
a token) is replayed through the real server; the report is opened in
Debian's headless Chromium. From the DOM after the page's script ran: the
heatmap drew a cell per (expert, column), the collapsed layer's cells change
at the collapse, the dead expert's are all "none", and the Moe alerts are
marked over it. A screenshot of the section is kept in
BUILD_DIR/test-artifacts/report-moe.png (docs/img/report-moe.png is one).
"""

import html.parser
import json
import random

from test_report_browser import dump_dom, screenshot

STEPS = 600
LAYERS = 4
EXPERTS = 8
TOP_K = 2
COLLAPSE_AT = 300
COLLAPSED_LAYER = "2"
HOT = (1, 6)
DEAD_LAYER, DEAD_EXPERT = "0", 5
ASSIGNMENTS = 2048 * TOP_K
# The page's cap: at most this many columns of steps (kMoeHeatmapColumns).
COLUMNS = 240


def shares(layer, step):
    """The routing probabilities of one layer at one step."""
    if layer == COLLAPSED_LAYER and step >= COLLAPSE_AT:
        # Nearly everything onto two experts; a trickle elsewhere.
        return [0.485 if e in HOT else 0.005 for e in range(EXPERTS)]
    p = [1.0] * EXPERTS
    if layer == DEAD_LAYER:
        p[DEAD_EXPERT] = 0.0
    return [v / sum(p) for v in p]


def moe_scenario(path):
    rnd = random.Random(11)
    lines = [json.dumps({"run_start": {
        "run_id": "report-moe", "precision": "BF16", "max_norm": 1.0, "warmup_steps": 20,
        "labels": {"model": "tiny-moe"},
        "moe": {"num_experts": EXPERTS, "top_k": TOP_K, "balancing": "AUX_LOSS",
                "aux_loss_coeff": 0.01, "z_loss_coeff": 0.001}}})]
    for s in range(STEPS):
        layers = []
        for i in range(LAYERS):
            name = str(i)
            p = shares(name, s)
            counts = [max(0, round(ASSIGNMENTS * q * (1 + rnd.gauss(0, 0.05)))) if q else 0
                      for q in p]
            f = [c / sum(counts) for c in counts]
            layers.append({"layer": name, "tokens_per_expert": counts,
                           "aux_loss": EXPERTS * sum(a * b for a, b in zip(f, p)),
                           "z_loss": 2.0 + rnd.gauss(0, 0.05),
                           "router_logit_max": 3.0 + rnd.gauss(0, 0.1)})
        lines.append(json.dumps({"step": s, "grad_norm": 0.4 + rnd.gauss(0, 0.02),
                                 "loss": 4.0 - s / STEPS + rnd.gauss(0, 0.01), "lr": 1e-3,
                                 "moe": {"layers": layers}}))
    lines.append(json.dumps({"event": {"step": STEPS - 1, "kind": "RUN_FINISHED"}}))
    path.write_text("\n".join(lines) + "\n")


class HeatmapParser(html.parser.HTMLParser):
    """The heatmap element's attributes, its cells by (layer, expert), and
    the alert lanes drawn over it."""

    def __init__(self):
        super().__init__()
        self.heatmap = None
        self.layers = {}
        self.cells = {}
        self.lanes = []
        self._row = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = a.get("class", "").split()
        if tag == "div" and a.get("id") == "moe-heatmap":
            self.heatmap = a
        elif tag == "g" and "moe-layer" in classes:
            self.layers[a["data-layer"]] = a
        elif tag == "g" and "moe-row" in classes:
            self._row = (a["data-layer"], int(a["data-expert"]))
            self.cells[self._row] = []
        elif tag == "rect" and "cell" in classes and self._row:
            self.cells[self._row].append((int(a["data-step"]), int(a["data-load"]), a["fill"]))
        elif tag == "rect" and "lane" in classes:
            self.lanes.append(a["data-alert"])

    def handle_endtag(self, tag):
        if tag == "g":
            self._row = None


def test_moe_heatmap_shows_the_collapse_and_the_dead_expert_in_chromium(server, tmp_path):
    log = tmp_path / "moe.jsonl"
    moe_scenario(log)
    server.ctl("replay", str(log))
    alerts = {a["alertname"]: a for a in server.ctl_json("alerts", "--run", "report-moe")}
    assert {"MoeRouterCollapse", "MoeDeadExpert"} <= set(alerts), alerts
    assert COLLAPSE_AT <= alerts["MoeRouterCollapse"]["started_step"] < COLLAPSE_AT + 50

    page = tmp_path / "report-moe.html"
    server.ctl("report", "--run", "report-moe", "--out", str(page))
    dom = dump_dom(page)
    parser = HeatmapParser()
    parser.feed(dom.stdout)

    h = parser.heatmap
    assert h is not None and h.get("data-drawn") == "1", h
    assert h["data-layers"] == str(LAYERS)
    assert h["data-rows"] == str(LAYERS * EXPERTS)
    assert h["data-columns"] == str(COLUMNS)
    assert h["data-cells"] == str(LAYERS * EXPERTS * COLUMNS)
    assert set(parser.layers) == {str(i) for i in range(LAYERS)}
    assert len(parser.cells) == LAYERS * EXPERTS
    assert all(len(c) == COLUMNS for c in parser.cells.values())

    # The collapse: before it every expert of layer 2 is near an even share
    # (100%); after it the two hot ones take ~4x and the rest next to none,
    # in other colours.
    for e in range(EXPERTS):
        before = [c for c in parser.cells[(COLLAPSED_LAYER, e)] if c[0] < COLLAPSE_AT - 3]
        after = [c for c in parser.cells[(COLLAPSED_LAYER, e)] if c[0] >= COLLAPSE_AT]
        assert before and after
        assert all(70 <= load <= 130 for _, load, _ in before), (e, before)
        if e in HOT:
            assert all(load >= 350 for _, load, _ in after), (e, after)
        else:
            assert all(0 < load <= 10 for _, load, _ in after), (e, after)
        assert {fill for *_, fill in before}.isdisjoint({fill for *_, fill in after}), e
    # The other layers stay even.
    assert all(70 <= load <= 130 for _, load, _ in parser.cells[("3", 0)])
    # The dead expert: no assignment in any column, one colour for "none".
    dead = parser.cells[(DEAD_LAYER, DEAD_EXPERT)]
    assert {load for _, load, _ in dead} == {0}
    assert len({fill for *_, fill in dead}) == 1
    assert dead[0][2] not in {fill for _, _, fill in parser.cells[("3", 0)]}

    # The Moe alerts are marked over the heatmap, not over the norm chart.
    assert {"MoeRouterCollapse", "MoeDeadExpert"} <= set(parser.lanes), parser.lanes
    assert int(h["data-alert-spans"]) == len(parser.lanes)
    assert 'data-alert="MoeRouterCollapse"' not in dom.stdout.split('id="moe-heatmap"')[0]

    # The run's header and the MoE section alone, for the docs' picture
    # (headless Chromium's screenshot does not scroll to a #fragment).
    section = tmp_path / "report-moe-section.html"
    section.write_text(page.read_text().replace(
        "</head>", "<style>body > section:not(#moe), footer { display: none }</style>\n</head>",
        1))
    screenshot(section, "report-moe.png", 740)
