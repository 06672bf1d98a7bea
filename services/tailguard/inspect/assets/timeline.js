// Draws a tailguard job timeline as SVG from the JSON in #timeline-data (inspect/timeline.py's
// as_data). No network, no library: the page must open from a file on any machine.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("timeline-data").textContent);
  const LABEL_W = 190, AXIS_H = 28, LANE_H = 26, VERTEX_H = 22, GAP = 10, PAD_R = 24;
  const width = Math.max(900, document.documentElement.clientWidth - 32);
  const span = Math.max(data.end_ms, 1);
  const x = (ms) => LABEL_W + (ms / span) * (width - LABEL_W - PAD_R);
  const secs = (ms) => "+" + (ms / 1000).toFixed(3) + " s";

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x0, y0, value, cls) {
    const node = el("text", { x: x0, y: y0, class: cls || "" }, parent);
    node.textContent = value;
    return node;
  }
  // Details on hover: the native tooltip (<title>) and the panel that follows the pointer.
  function details(node, lines) {
    const body = lines.filter((l) => l !== null && l !== "").join("\n");
    node.setAttribute("data-tip", body);
    el("title", {}, node).textContent = body;
  }
  function rect(parent, x0, x1, y0, h, cls) {
    const w = Math.max(x(x1) - x(x0), 1.5);
    return el("rect", { x: x(x0), y: y0, width: w, height: h, class: cls }, parent);
  }
  function bytes(n) {
    if (n === null || n === undefined) return "?";
    const units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (const [unit, f] of units) if (n >= f) return (n / f).toFixed(1) + " " + unit;
    return n + " B";
  }

  const hostLanes = data.hosts.reduce((n, h) => n + h.lanes.length, 0);
  const height = AXIS_H + data.vertices.length * VERTEX_H + GAP * 2 + hostLanes * LANE_H
    + data.hosts.length * 4 + 8;
  const svg = el("svg", { width: width, height: height, id: "timeline",
    viewBox: "0 0 " + width + " " + height }, document.getElementById("chart"));
  const defs = el("defs", {}, svg);
  for (const [id, colour] of [["hatch-blocked", "#c0392b"], ["hatch-absent", "#555"]]) {
    const p = el("pattern", { id: id, width: 8, height: 8, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" }, defs);
    el("line", { x1: 0, y1: 0, x2: 0, y2: 8, stroke: colour, "stroke-width": 3,
      "stroke-opacity": 0.35 }, p);
  }

  // Time axis: about ten ticks at a round step.
  const axis = el("g", { class: "axis" }, svg);
  const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 18e5, 36e5];
  const step = steps.find((s) => span / s <= 12) || steps[steps.length - 1];
  for (let t = 0; t <= span; t += step) {
    el("line", { x1: x(t), x2: x(t), y1: AXIS_H - 6, y2: height, class: "tick" }, axis);
    text(axis, x(t) + 2, AXIS_H - 10, (t / 1000) + " s", "tick-label");
  }

  let y = AXIS_H;
  // Vertex (chain) phases: a thin line from initialisation on, thick while attempts ran.
  const phases = el("g", { class: "vertices" }, svg);
  for (const v of data.vertices) {
    const g = el("g", { class: "vertex", "data-vertex": v.vertex }, phases);
    text(g, 6, y + 15, v.vertex, "lane-label");
    const ended = v.running.length ? v.running[v.running.length - 1].end_ms : null;
    if (v.initialized_ms !== null) {
      el("line", { x1: x(v.initialized_ms), x2: x(ended === null ? data.end_ms : ended),
        y1: y + 11, y2: y + 11, class: "waiting" }, g);
    }
    const info = [
      "vertex " + v.vertex,
      v.operators.length ? "operators: " + v.operators.join(" → ") : null,
      "parallelism " + (v.parallelism === null ? "?" : v.parallelism)
        + ", decided by " + v.decided_by,
      v.initialized_ms === null ? "not initialised" : "initialised at " + secs(v.initialized_ms),
      v.attempts + " attempt(s)" + (v.done ? ", every subtask finished" : ", not finished"),
    ];
    for (const s of v.running) {
      const r = rect(g, s.start_ms, s.end_ms, y + 4, VERTEX_H - 8, "phase");
      r.setAttribute("data-vertex", v.vertex);
      details(r, info.concat([s.label]));
    }
    y += VERTEX_H;
  }
  y += GAP;

  // Hosts: their lanes, blocked and absent spans over all of them, one bar per attempt.
  const laneY = {};
  const overlays = [];
  const hosts = el("g", { class: "hosts" }, svg);
  for (const host of data.hosts) {
    const top = y;
    const g = el("g", { class: "host", "data-host": host.name }, hosts);
    for (const index of host.lanes) {
      const lane = data.lanes[index];
      const lg = el("g", { class: "lane", "data-host": lane.host, "data-slot": lane.slot }, g);
      el("rect", { x: LABEL_W, y: y, width: width - LABEL_W - PAD_R, height: LANE_H,
        class: "lane-bg" }, lg);
      text(lg, 6, y + 17, lane.host + " · slot " + lane.slot, "lane-label");
      laneY[index] = y;
      y += LANE_H;
    }
    for (const [kind, spans] of [["block", host.blocked], ["absent", host.absent]]) {
      for (const s of spans) {
        const r = rect(g, s.start_ms, s.end_ms, top, y - top, kind);
        r.setAttribute("data-host", host.name);
        details(r, [host.name + ": " + s.label, "records: " + s.record_ids.join(", ")]);
        // The same shading over the bars too, letting the pointer through to them.
        overlays.push([s, top, y - top, kind + "-over"]);
      }
    }
    y += 4;
  }
  const bars = el("g", { class: "bars" }, svg);
  for (const b of data.bars) {
    const name = b.vertex + "#" + b.subtask + "." + b.attempt;
    const outcome = b.outcome.replace(/ /g, "-");
    const g = el("g", { class: "attempt" }, bars);
    const r = rect(g, b.start_ms, b.end_ms, laneY[b.lane] + 3, LANE_H - 6,
      "bar " + outcome + (b.speculative ? " speculative" : ""));
    r.setAttribute("data-attempt", name);
    r.setAttribute("data-outcome", b.outcome);
    r.setAttribute("data-speculative", String(b.speculative));
    r.setAttribute("data-host", b.host);
    details(r, [
      name + (b.speculative ? " (speculative)" : "") + ": " + b.outcome,
      "on " + b.host + " · " + secs(b.start_ms) + " to " + secs(b.end_ms)
        + " (" + ((b.end_ms - b.start_ms) / 1000).toFixed(3) + " s)",
      b.input_bytes !== null ? "read " + bytes(b.input_bytes) + ", " + b.records
        + " records, wrote " + bytes(b.output_bytes) : null,
      b.detail,
      "started by (" + b.cause.kind + "): " + b.cause.summary,
      b.cause.because.length ? "because: " + b.cause.because.join("\n  ") : null,
      "events: " + b.deploy_id + (b.end_id ? ", " + b.end_id : ""),
    ]);
    // The full attempt name where it fits, else only its subtask and attempt numbers.
    const w = x(b.end_ms) - x(b.start_ms);
    const mark = b.speculative ? "↯ " : "";
    const label = [mark + name, mark + "#" + b.subtask + "." + b.attempt]
      .find((l) => w > l.length * 7 + 6);
    if (label) text(g, x(b.start_ms) + 4, laneY[b.lane] + 17, label, "bar-label");
  }
  const over = el("g", { class: "overlays" }, svg);
  for (const [s, top, h, cls] of overlays) rect(over, s.start_ms, s.end_ms, top, h, cls);

  // A driver's takeover: a line across the whole chart, its summary on hover.
  const marks = el("g", { class: "marks" }, svg);
  for (const m of data.marks) {
    const g = el("g", { class: "mark", "data-event": m.record_id }, marks);
    el("line", { x1: x(m.at_ms), x2: x(m.at_ms), y1: AXIS_H - 6, y2: height, class: "mark-line" }, g);
    el("rect", { x: x(m.at_ms) - 4, y: AXIS_H - 6, width: 8, height: height - AXIS_H + 6,
      class: "mark-hit" }, g);
    text(g, x(m.at_ms) + 4, AXIS_H - 1, "driver recovered", "mark-label");
    details(g, [secs(m.at_ms) + ": " + m.label, "event: " + m.record_id]);
  }

  // The hover panel.
  const tip = document.getElementById("tip");
  svg.addEventListener("mousemove", (ev) => {
    const target = ev.target.closest("[data-tip]");
    if (!target) { tip.hidden = true; return; }
    tip.textContent = target.getAttribute("data-tip");
    tip.hidden = false;
    const left = Math.min(ev.pageX + 14, window.scrollX + window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = left + "px";
    tip.style.top = (ev.pageY + 14) + "px";
  });
  svg.addEventListener("mouseleave", () => { tip.hidden = true; });

  const started = new Date(data.start_ts).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  document.getElementById("summary").textContent = data.job_id + " · " + data.status + " · "
    + (data.end_ms / 1000).toFixed(1) + " s from " + started + " · " + data.bars.length
    + " attempts on " + data.lanes.length + " slots of " + data.hosts.length + " hosts";
  document.body.setAttribute("data-rendered", "true");
})();
