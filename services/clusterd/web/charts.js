// Small SVG charts for the faultmesh web view (no library, no build step).
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Grouped bar chart. series: [{name, color, values: [number|null]}], labels: [string], opts.mark: Set of labels to flag.
function barChart(labels, series, opts = {}) {
  const w = opts.width || Math.max(540, 60 + labels.length * (14 * series.length + 10)), h = opts.height || 220;
  const left = 44, bottom = 34, top = 22, plotH = h - top - bottom;
  const all = series.flatMap(s => s.values).filter(v => v !== null && v !== undefined);
  const max = Math.max(opts.min_max || 0, ...all, 0.0001) * 1.1;
  const svg = svgEl("svg", { width: w, height: h, class: "chart bar", role: "img" });
  if (opts.title) svg.appendChild(svgEl("text", { x: left, y: 14, "font-weight": 600 }, opts.title));
  svg.appendChild(svgEl("line", { x1: left, y1: top, x2: left, y2: top + plotH, class: "axis" }));
  svg.appendChild(svgEl("line", { x1: left, y1: top + plotH, x2: w - 6, y2: top + plotH, class: "axis" }));
  for (let t = 0; t <= 4; t++) {
    const v = (max * t) / 4, y = top + plotH - (plotH * t) / 4;
    svg.appendChild(svgEl("text", { x: left - 4, y: y + 4, "text-anchor": "end" }, v.toFixed(2)));
  }
  if (opts.ref !== undefined) {
    const y = top + plotH - (plotH * opts.ref) / max;
    svg.appendChild(svgEl("line", { x1: left, y1: y, x2: w - 6, y2: y, stroke: "#999", "stroke-dasharray": "4 3" }));
  }
  const groupW = (w - left - 10) / Math.max(1, labels.length), barW = Math.min(16, (groupW - 6) / series.length);
  labels.forEach((lab, i) => {
    const x0 = left + 4 + i * groupW;
    series.forEach((s, j) => {
      const v = s.values[i];
      if (v === null || v === undefined) return;
      const bh = (plotH * v) / max;
      const r = svgEl("rect", { x: x0 + j * barW, y: top + plotH - bh, width: barW - 1, height: bh, fill: s.color });
      r.appendChild(svgEl("title", {}, `${lab} ${s.name}: ${v.toFixed(3)}`));
      svg.appendChild(r);
    });
    const flagged = opts.mark && opts.mark.has(lab);
    svg.appendChild(svgEl("text", { x: x0 + (barW * series.length) / 2, y: top + plotH + 14, "text-anchor": "middle",
      "font-weight": flagged ? 700 : 400, fill: flagged ? "#d9412e" : "#1d2430" }, lab));
  });
  series.forEach((s, j) => {
    const x = left + j * 160, y = h - 6;
    svg.appendChild(svgEl("rect", { x, y: y - 9, width: 10, height: 10, fill: s.color }));
    svg.appendChild(svgEl("text", { x: x + 14, y }, s.name));
  });
  return svg;
}

// Heat map: rows x cols with value(r, c) in [0, 1] (null: no data); colour green -> yellow -> red.
function heatColor(v) {
  if (v === null || v === undefined) return "#e4e8ee";
  const t = Math.max(0, Math.min(1, v));
  const hue = 120 * (1 - Math.min(1, t * 2));
  return `hsl(${hue}, 70%, ${50 - 10 * t}%)`;
}

function heatMap(rows, cols, value, opts = {}) {
  const cell = opts.cell || 34, left = opts.left || 90, top = opts.top || 90;
  const svg = svgEl("svg", { width: Math.max(400, left + cols.length * cell + 10), height: top + rows.length * cell + 30, class: "chart heat", role: "img" });
  cols.forEach((c, j) => {
    const x = left + j * cell + cell / 2;
    svg.appendChild(svgEl("text", { x, y: top - 6, transform: `rotate(-45 ${x} ${top - 6})` }, c));
  });
  rows.forEach((r, i) => {
    const y = top + i * cell;
    svg.appendChild(svgEl("text", { x: left - 6, y: y + cell / 2 + 4, "text-anchor": "end" }, r));
    cols.forEach((c, j) => {
      const v = value(r, c);
      const rect = svgEl("rect", { x: left + j * cell, y, width: cell - 2, height: cell - 2, fill: heatColor(v),
        "data-src": r, "data-dst": c, "data-value": v === null ? "" : v });
      rect.appendChild(svgEl("title", {}, `${r} -> ${c}: ${v === null ? "no data" : (v * 100).toFixed(1) + "% loss"}`));
      svg.appendChild(rect);
      if (v !== null) svg.appendChild(svgEl("text", { x: left + j * cell + cell / 2 - 1, y: y + cell / 2 + 3,
        "text-anchor": "middle", fill: "#fff" }, Math.round(v * 100)));
    });
  });
  svg.appendChild(svgEl("text", { x: left, y: top + rows.length * cell + 18 }, opts.caption || "loss rate, % (rows: source, columns: destination)"));
  return svg;
}

// Timeline: items [{t: ms, label, color}] along one axis.
function timeline(items, opts = {}) {
  const w = opts.width || 760, rowH = 18, top = 20, h = top + 24 + items.length * rowH;
  const svg = svgEl("svg", { width: w, height: h, class: "chart timeline", role: "img" });
  if (!items.length) return svg;
  const t0 = Math.min(...items.map(i => i.t)), t1 = Math.max(...items.map(i => i.t), t0 + 1000);
  const left = 70, right = 260, x = t => left + ((t - t0) / (t1 - t0)) * (w - left - right);
  svg.appendChild(svgEl("line", { x1: left, y1: top, x2: w - right, y2: top, class: "axis" }));
  svg.appendChild(svgEl("text", { x: left, y: top - 6 }, new Date(t0).toLocaleTimeString()));
  svg.appendChild(svgEl("text", { x: w - right, y: top - 6, "text-anchor": "end" }, new Date(t1).toLocaleTimeString()));
  items.forEach((it, i) => {
    const y = top + 16 + i * rowH, cx = x(it.t);
    svg.appendChild(svgEl("line", { x1: cx, y1: top, x2: cx, y2: y, stroke: "#c6ccd6" }));
    svg.appendChild(svgEl("circle", { cx, cy: y, r: 5, fill: it.color || "#5b8def" }));
    svg.appendChild(svgEl("text", { x: w - right + 10, y: y + 4 }, it.label));
  });
  return svg;
}
