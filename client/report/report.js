// Draws the report's charts as SVG from the JSON in #tw-data. Every chart
// element gets data-drawn="1" and data-points (finite points drawn) once
// drawn; the body gets data-charts-drawn. An MoE run's heatmap element gets
// data-drawn, data-cells and data-alert-spans. No external code, no network.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 1100, H = 210, L = 64, R = 200, T = 8, B = 26;
  var data = JSON.parse(document.getElementById("tw-data").textContent);

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function num(v) { return typeof v === "number" ? v : Number(v); }
  function fmt(v) {
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return String(Math.round(v * 1000) / 1000);
  }
  function finite(v) { return typeof v === "number" && isFinite(v); }

  function yRange(chart) {
    var lo = Infinity, hi = -Infinity;
    function take(v) {
      v = num(v);
      if (!isFinite(v) || (chart.log && v <= 0)) return;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (chart.band) { chart.band.lo.forEach(take); chart.band.hi.forEach(take); }
    if (chart.ref) { chart.ref.lo.forEach(take); chart.ref.hi.forEach(take); }
    chart.lines.forEach(function (l) { l.y.forEach(take); });
    chart.hlines.forEach(function (h) { take(h.y); });
    if (!isFinite(lo)) return null;
    if (chart.id === "clip_fraction") { lo = 0; hi = Math.max(hi, 0.1); }
    if (lo === hi) { lo = chart.log ? lo / 2 : lo - 1; hi = chart.log ? hi * 2 : hi + 1; }
    return [lo, hi];
  }

  function draw(chart, box) {
    var range = yRange(chart);
    var x0 = data.first_step, x1 = Math.max(data.last_step, x0 + 1);
    if (!range) {
      var p = document.createElement("p");
      p.className = "empty";
      p.textContent = chart.note || "no data";
      box.appendChild(p);
      box.setAttribute("data-drawn", "1");
      box.setAttribute("data-points", "0");
      box.setAttribute("data-alert-spans", "0");
      return;
    }
    var log = chart.log;
    var ylo = log ? Math.log10(range[0]) : range[0];
    var yhi = log ? Math.log10(range[1]) : range[1];
    if (!log) { var pad = (yhi - ylo) * 0.05; ylo -= pad; yhi += pad; }
    function sx(s) { return L + (num(s) - x0) / (x1 - x0) * (W - L - R); }
    function sy(v) {
      v = num(v);
      var t = log ? Math.log10(Math.max(v, range[0])) : v;
      return T + (1 - (t - ylo) / (yhi - ylo)) * (H - T - B);
    }
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
                          "aria-label": chart.title }, null);
    // Grid and axes.
    var axis = el("g", { "class": "axis" }, svg);
    for (var i = 0; i <= 4; i++) {
      var t = ylo + (yhi - ylo) * i / 4, y = T + (1 - i / 4) * (H - T - B);
      el("line", { "class": "grid", x1: L, x2: W - R, y1: y, y2: y }, axis);
      var label = el("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, axis);
      label.textContent = fmt(log ? Math.pow(10, t) : t);
    }
    for (var j = 0; j <= 5; j++) {
      var s = x0 + (x1 - x0) * j / 5, x = sx(s);
      el("line", { x1: x, x2: x, y1: H - B, y2: H - B + 4 }, axis);
      var tl = el("text", { x: x, y: H - 8, "text-anchor": "middle" }, axis);
      tl.textContent = "step " + Math.round(s);
    }
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B }, axis);
    // Alert spans first, under the data.
    var spans = 0;
    data.alerts.forEach(function (a) {
      if (chart.alerts.indexOf(a.name) < 0) return;
      var xa = sx(a.from), xb = sx(a.to);
      var r = el("rect", { "class": "alert-span sev-" + a.severity,
                           "data-alert": a.name, x: xa, y: T,
                           width: Math.max(xb - xa, 2), height: H - T - B }, svg);
      var title = el("title", {}, r);
      title.textContent = a.name + " (" + a.severity + ", " + a.state +
          "), steps " + a.from + "-" + a.to + ": " + a.summary;
      spans++;
    });
    // Warmup, shaded lightly.
    if (data.warmup_steps > x0) {
      el("rect", { x: L, y: T, width: Math.max(sx(data.warmup_steps) - L, 0),
                   height: H - T - B, fill: "#adb5bd", opacity: 0.12 }, svg);
    }
    // The reference runs' band, under everything of the run's own.
    if (chart.ref && chart.ref.x.length) {
      var up = "", down = "", mid = "";
      for (var k = 0; k < chart.ref.x.length; k++) {
        var rx = sx(chart.ref.x[k]).toFixed(1);
        up += (up ? "L" : "M") + rx + "," + sy(chart.ref.hi[k]).toFixed(1);
        mid += (mid ? "L" : "M") + rx + "," + sy(chart.ref.median[k]).toFixed(1);
      }
      for (var j = chart.ref.x.length - 1; j >= 0; j--) {
        down += "L" + sx(chart.ref.x[j]).toFixed(1) + "," + sy(chart.ref.lo[j]).toFixed(1);
      }
      el("path", { "class": "ref-band", d: up + down + "Z" }, svg);
      el("path", { "class": "ref-median", d: mid }, svg);
      box.setAttribute("data-ref-bins", String(chart.ref.x.length));
    }
    // Min/max per column: a zigzag through each column's max and min.
    if (chart.band && chart.band.x.length) {
      var d = "";
      for (var k = 0; k < chart.band.x.length; k++) {
        var bx = sx(chart.band.x[k]).toFixed(1);
        var hi = chart.band.hi[k], lo = chart.band.lo[k];
        if (!finite(num(hi)) || (log && num(lo) <= 0 && num(hi) <= 0)) continue;
        d += (d ? "L" : "M") + bx + "," + sy(hi).toFixed(1) +
             "L" + bx + "," + sy(lo).toFixed(1);
      }
      el("path", { "class": "band", d: d }, svg);
    }
    chart.lines.forEach(function (line, n) {
      var d = "";
      for (var k = 0; k < line.x.length; k++) {
        if (!finite(num(line.y[k]))) continue;
        d += (d ? "L" : "M") + sx(line.x[k]).toFixed(1) + "," + sy(line.y[k]).toFixed(1);
      }
      el("path", { "class": "line line-" + n, d: d }, svg);
    });
    chart.hlines.forEach(function (h, n) {
      if (log && h.y <= 0) return;
      var g = el("g", { "class": "hline hline-" + n }, svg);
      var y = sy(h.y);
      el("line", { x1: L, x2: W - R, y1: y, y2: y }, g);
      var t = el("text", { x: W - R + 4, y: y + 4 }, g);
      t.textContent = h.name;
    });
    chart.marks.x.forEach(function (m) {
      var x = sx(m);
      el("line", { "class": "mark", x1: x, x2: x, y1: T, y2: T + 10 }, svg);
    });
    // Legend on the right.
    var ly = T + 12;
    function legend(text, cls) {
      var t = el("text", { "class": "legend-item " + (cls || ""), x: W - R + 4, y: ly }, svg);
      t.textContent = text;
      ly += 14;
    }
    if (chart.ref) {
      legend("shaded: the baselines' band", "ref-legend");
      legend("dashed: their median", "ref-legend");
    }
    if (chart.band) legend("min/max per column");
    chart.lines.forEach(function (l) { legend(l.name); });
    if (chart.marks.x.length) legend("red ticks: " + chart.marks.name);
    if (chart.note) legend(chart.note);
    box.appendChild(svg);
    box.setAttribute("data-drawn", "1");
    box.setAttribute("data-points", String(chart.points));
    box.setAttribute("data-alert-spans", String(spans));
  }

  // The MoE heatmap: one panel per layer, a row per expert drawn, a cell per
  // column of steps coloured by the expert's load against an even share
  // (data.moe.layers[].load: percent, 100 = 1/E, 0 = none, null = no counts).
  // The Moe* alerts are lanes above the panels, with lines down through them.
  var EVEN = [241, 243, 245], DEAD = "#111418";
  var HOT = [[255, 212, 59], [253, 126, 20], [224, 49, 49]];    // 2x, 4x, >= 8x
  var COLD = [[165, 216, 255], [77, 171, 247], [25, 113, 194]];  // 1/2, 1/4, <= 1/8
  function loadColour(v) {
    if (v === 0) return DEAD;
    var t = Math.max(-3, Math.min(3, Math.log2(v / 100)));  // octaves from even
    var stops = t < 0 ? COLD : HOT, u = Math.abs(t);
    var i = Math.min(Math.floor(u), 2), f = u - i;
    var a = i === 0 ? EVEN : stops[i - 1], b = stops[i];
    var c = [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); });
    return "rgb(" + c.join(",") + ")";
  }

  function drawHeatmap(moe, box) {
    var x0 = data.first_step, x1 = Math.max(data.last_step, x0 + 1);
    function sx(s) { return L + (num(s) - x0) / (x1 - x0) * (W - L - R); }
    var rows = 0;
    moe.layers.forEach(function (l) { rows += l.rows.length; });
    // Rows of 2-10 px: a 48-layer run stays a few screens tall.
    var rh = Math.max(2, Math.min(10, Math.floor((1500 - 16 * moe.layers.length) / rows)));
    // Rows too thin to label: the layer's name beside its panel instead of
    // above it, and no expert labels (each row's tooltip names it).
    var compact = rh < 6, gap = compact ? 4 : 16;
    var marked = data.alerts.filter(function (a) { return moe.alerts.indexOf(a.name) >= 0; });
    var lanes = [];
    marked.forEach(function (a) { if (lanes.indexOf(a.name) < 0) lanes.push(a.name); });
    var laneH = 15, top = T + lanes.length * laneH + (lanes.length ? 6 : 0);
    var height = top;
    moe.layers.forEach(function (l) { height += gap + l.rows.length * rh; });
    var legendH = T + 9 * 16 + 20;
    var h = Math.max(height + B, legendH);
    var svg = el("svg", { viewBox: "0 0 " + W + " " + h, role: "img",
                          "aria-label": "MoE load per expert" }, null);
    // Column edges: a cell runs from its column's first step to the next's.
    var edges = moe.x.map(sx);
    edges.push(sx(x1));
    var cells = 0, y = top, subset = moe.layers.some(function (l) {
      return l.rows.length < l.experts;
    });
    moe.layers.forEach(function (l) {
      var g = el("g", { "class": "moe-layer", "data-layer": l.layer,
                        "data-experts": String(l.experts),
                        "data-rows": String(l.rows.length) }, svg);
      if (compact) {
        y += gap;
        el("text", { "class": "layer-label", x: L - 4, y: y + l.rows.length * rh / 2 + 4,
                     "text-anchor": "end" }, g).textContent = "layer " + l.layer;
      } else {
        el("text", { "class": "layer-label", x: L, y: y + 12 }, g).textContent =
            "layer " + l.layer + ": " + (l.rows.length < l.experts
                ? l.rows.length + " of " + l.experts + " experts (the furthest from even)"
                : l.experts + " experts");
        y += gap;
      }
      // Label every row when they are tall enough, else about every 20 px.
      var every = rh >= 9 ? 1 : Math.ceil(20 / rh);
      l.rows.forEach(function (e, r) {
        var row = el("g", { "class": "moe-row", "data-layer": l.layer,
                            "data-expert": String(e) }, g);
        el("title", {}, row).textContent = "layer " + l.layer + ", expert " + e;
        l.load[r].forEach(function (v, c) {
          if (v === null) return;
          el("rect", { "class": "cell", x: edges[c].toFixed(1), y: y,
                       width: Math.max(edges[c + 1] - edges[c], 0.6).toFixed(1),
                       height: rh, fill: loadColour(v),
                       "data-step": String(moe.x[c]), "data-load": String(v) }, row);
          cells++;
        });
        if (!compact && r % every === 0) {
          var t = el("text", { "class": "expert-label", x: L - 4, y: y + Math.min(rh, 9),
                               "text-anchor": "end" }, g);
          t.textContent = "e" + e;
        }
        y += rh;
      });
    });
    // Step axis under the panels.
    var axis = el("g", { "class": "axis" }, svg);
    el("line", { x1: L, x2: W - R, y1: height, y2: height }, axis);
    for (var j = 0; j <= 5; j++) {
      var s = x0 + (x1 - x0) * j / 5, x = sx(s);
      el("line", { x1: x, x2: x, y1: height, y2: height + 4 }, axis);
      el("text", { x: x, y: height + 18, "text-anchor": "middle" }, axis)
          .textContent = "step " + Math.round(s);
    }
    // Alert lanes and their onset/resolve lines.
    var spans = 0;
    marked.forEach(function (a) {
      var ly = T + lanes.indexOf(a.name) * laneH;
      var xa = sx(a.from), xb = Math.max(sx(a.to), xa + 2);
      var r = el("rect", { "class": "alert-span lane sev-" + a.severity,
                           "data-alert": a.name, x: xa, y: ly,
                           width: xb - xa, height: laneH - 3 }, svg);
      el("title", {}, r).textContent = a.name + " (" + a.severity + ", " + a.state +
          "), steps " + a.from + "-" + a.to + ": " + a.summary;
      var label = el("text", { "class": "lane-label", y: ly + laneH - 6 }, svg);
      label.textContent = a.name;
      // Inside the bar when it fits, else after it, else before it.
      var wide = 6 * a.name.length + 6;
      if (xb - xa > wide) label.setAttribute("x", xa + 3);
      else if (xb + wide < W - R) label.setAttribute("x", xb + 3);
      else { label.setAttribute("x", xa - 3); label.setAttribute("text-anchor", "end"); }
      [xa, a.state === "resolved" ? xb : null].forEach(function (xl) {
        if (xl === null) return;
        el("line", { "class": "alert-line sev-" + a.severity, "data-alert": a.name,
                     x1: xl, x2: xl, y1: ly + laneH - 3, y2: height }, svg);
      });
      spans++;
    });
    // Colour legend on the right.
    var lx = W - R + 14, ly = T + 4;
    el("text", { "class": "legend-item", x: lx, y: ly + 8 }, svg).textContent =
        "load / even share (1/E)";
    ly += 16;
    [[0, "0: no assignment"], [12.5, "1/8 or less"], [25, "1/4"], [50, "1/2"],
     [100, "1: even"], [200, "2x"], [400, "4x"], [800, "8x or more"]]
        .forEach(function (entry) {
          el("rect", { "class": "swatch", x: lx, y: ly, width: 14, height: 12,
                       fill: loadColour(entry[0]) }, svg);
          el("text", { "class": "legend-item", x: lx + 20, y: ly + 10 }, svg)
              .textContent = entry[1];
          ly += 16;
        });
    if (compact && subset) {
      var most = Math.max.apply(null, moe.layers.map(function (l) { return l.rows.length; }));
      ["Rows: per layer at most", most + " experts, the furthest",
       "from an even share"].forEach(function (line) {
        el("text", { "class": "legend-item", x: lx, y: ly + 12 }, svg).textContent = line;
        ly += 14;
      });
    }
    box.appendChild(svg);
    box.setAttribute("data-drawn", "1");
    box.setAttribute("data-layers", String(moe.layers.length));
    box.setAttribute("data-rows", String(rows));
    box.setAttribute("data-columns", String(moe.x.length));
    box.setAttribute("data-cells", String(cells));
    box.setAttribute("data-alert-spans", String(spans));
  }

  var drawn = 0;
  data.charts.forEach(function (chart) {
    var box = document.getElementById("chart-" + chart.id);
    if (!box) return;
    draw(chart, box);
    drawn++;
  });
  document.body.setAttribute("data-charts-drawn", String(drawn));
  var heatmap = document.getElementById("moe-heatmap");
  if (heatmap && data.moe) drawHeatmap(data.moe, heatmap);
})();
