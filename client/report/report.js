// Draws the report's charts as SVG from the JSON in #tw-data. Every chart
// element gets data-drawn="1" and data-points (finite points drawn) once
// drawn; the body gets data-charts-drawn. No external code, no network.
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
    if (chart.band) legend("min/max per column");
    chart.lines.forEach(function (l) { legend(l.name); });
    if (chart.marks.x.length) legend("red ticks: " + chart.marks.name);
    if (chart.note) legend(chart.note);
    box.appendChild(svg);
    box.setAttribute("data-drawn", "1");
    box.setAttribute("data-points", String(chart.points));
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
})();
