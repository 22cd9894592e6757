// faultmesh web view: reads clusterd's JSON API (GET only) and its server-sent events.
"use strict";

const HEALTH_COLOR = { Healthy: "var(--healthy)", SubHealthy: "var(--sub)", UnHealthy: "var(--unhealthy)" };

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "html") e.innerHTML = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function pill(health) { return h("span", { class: `pill h-${health}` }, health); }
function ts(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
function table(headers, rows, attrs) {
  return h("table", attrs || {}, h("tr", {}, headers.map(x => h("th", {}, x))),
    rows.map(r => h("tr", {}, r.map(c => h("td", {}, c)))));
}
// why a change happened: the server's words (clusterd.audit.why_of, as `faultmesh history`'s WHY)
function why(e) {
  return e.why || "";
}

// who acknowledged a fault, until when and why ("" when nobody did)
function ackText(a) { return a ? `${a.by}${a.token ? ` (token ${a.token})` : ""} until ${ts(a.until_ms)}: ${a.reason}` : ""; }
// a grid cell's hover / focus text: each fault's code, name, level and what that level does
function cellText(codes, fallback) {
  if (!codes || !codes.length) return fallback;
  return codes.map(c => `${c.code}${c.name ? " " + c.name : ""}: ${c.level}` + (c.handling ? ` (${c.handling})` : "") +
    (c.acked ? `, acknowledged by ${c.acked}` : "")).join("\n");
}
// the attributes of a cell that has faults: focusable, its text as title and accessible label
function cellAttrs(codes, fallback) {
  const text = cellText(codes, fallback);
  return codes && codes.length ? { title: text, "aria-label": text, tabindex: "0" } : { title: text };
}
// " acked" when every fault of a cell is acknowledged (drawn with a dashed frame)
function ackedClass(codes) { return codes && codes.length && codes.every(c => c.acked) ? " acked" : ""; }
// a fault's device as a person names it: device_kind (GPU for an NVIDIA code) where the API gives it
function device(f) { const t = f.device_kind || f.device_type; return f.device_id < 0 ? t : `${t}-${f.device_id}`; }
function show(...nodes) { const m = document.getElementById("main"); m.replaceChildren(...nodes); }

// -- live updates -------------------------------------------------------------------------------
let refresh = async () => {};
let pending = null;
function live() {
  const badge = document.getElementById("live");
  const es = new EventSource("/v1/stream");
  const kick = () => { if (!pending) pending = setTimeout(() => { pending = null; refresh().catch(fail); }, 150); };
  es.addEventListener("hello", () => { badge.className = "live on"; });
  es.addEventListener("change", kick);
  es.addEventListener("resync", kick);
  es.onerror = () => { badge.className = "live off"; };
  // a page left for another (or kept in the back-forward cache) gives its stream back: a browser
  // holds 6 connections per host, and open streams of pages left behind starved the next page's fetches
  window.addEventListener("pagehide", () => es.close());
  window.addEventListener("pageshow", e => { if (e.persisted) location.reload(); });  // back: fresh data, new stream
}
function fail(e) { show(h("p", { class: "error" }, String(e.message || e))); }

// -- the cluster grid -----------------------------------------------------------------------------
async function gridPage() {
  document.title = "faultmesh: cluster";
  const g = await getJSON("/v1/grid");
  const count = k => g.nodes.filter(n => n.health === k).length;
  const cards = h("div", { class: "cards" },
    h("div", { class: "card" }, h("b", {}, g.nodes.length), "nodes"),
    ["Healthy", "SubHealthy", "UnHealthy"].map(k => h("div", { class: "card" }, h("b", { style: `color:${HEALTH_COLOR[k]}` }, count(k)), k)),
    h("div", { class: "card" }, h("b", {}, g.nodes.reduce((a, n) => a + n.faults, 0)), "active faults"));
  const head = h("tr", {}, h("th", {}, "node"), h("th", {}, "health"), h("th", {}, "node-level"),
    g.npus.map(i => h("th", {}, `NPU ${i}`)), h("th", {}, "agents"));
  const rows = g.nodes.map(n => h("tr", { "data-node": n.name, "data-health": n.health },
    h("td", { class: "name" }, h("a", { href: `/ui/node/${encodeURIComponent(n.name)}` }, n.name)),
    h("td", {}, pill(n.health)),
    h("td", { class: `cell ${n.node_faults ? "h-" + n.node_level_health : "lv-none"}${ackedClass(n.node_codes)}`, "data-cell": "node", "data-level": n.node_level || "",
      ...cellAttrs(n.node_codes, "no node fault") }, n.node_faults || ""),
    g.npus.map(i => {
      const c = n.npus[String(i)];
      if (!c) return h("td", { class: "cell lv-none", title: "not reported" }, "");
      const cls = c.faults || c.health !== "Healthy" ? `h-${c.health}` : "h-Healthy";
      return h("td", { class: `cell ${cls}${ackedClass(c.codes)}`, "data-npu": i, "data-level": c.level, ...cellAttrs(c.codes, c.level || c.health) }, c.faults || "");
    }),
    h("td", {}, n.agents.join(", "))));
  const legend = h("p", { class: "legend muted" },
    Object.entries(HEALTH_COLOR).map(([k, c]) => h("span", {}, h("i", { style: `background:${c}` }), k)),
    h("span", {}, h("i", { style: "background:var(--none)" }), "not reported"),
    h("span", {}, h("i", { class: "acked-key" }), "acknowledged"), " cell number: active faults");
  show(h("h1", {}, "Cluster"), cards,
    h("p", {}, h("a", { href: "/ui/jobs", id: "jobs-link" }, "jobs"), ": which job runs where, its health and recovery"),
    g.nodes.length ? h("table", { class: "grid", id: "grid" }, head, rows) : h("p", { class: "muted" }, "no node known yet"), legend);
}

// -- one node ----------------------------------------------------------------------------------------
async function nodePage(name) {
  document.title = `faultmesh: ${name}`;
  const v = await getJSON(`/v1/nodes/${encodeURIComponent(name)}/view`);  // one fetch: node, meanings, history, jobs
  const n = v.node, events = v.events;
  const meaning = c => v.meanings[c] ? `${v.meanings[c].name}: ${v.meanings[c].impact}` : "no description shipped";
  const kindColor = { occur: "var(--unhealthy)", update: "var(--sub)", recover: "var(--healthy)", ack: "var(--info)", unack: "var(--info)", release: "var(--healthy)" };
  const jobRows = v.jobs.map(j => [h("a", { href: `/ui/job/${encodeURIComponent(j.id)}` }, j.name), j.namespace, j.ranks.join(", "),
    j.touched.length ? j.touched.map(t => `rank ${t.rank} (NPU ${t.device_id}): ${t.codes.join(", ")}`).join("; ") : "not touched by a fault"]);
  show(
    h("h1", {}, `Node ${name} `, pill(n.health)),
    h("div", { class: "cards" },
      h("div", { class: "card" }, h("b", {}, n.faults), "active faults"),
      h("div", { class: "card" }, h("b", {}, n.worst_level || "-"), "worst level"),
      h("div", { class: "card" }, h("b", {}, n.agents.length), `agents: ${n.agents.join(", ") || "none connected"}`),
      h("div", { class: "card" }, h("b", {}, n.node_ip || "-"), "node IP")),
    h("h2", {}, "Active faults"),
    n.fault_list.length ? table(["device", "code", "level", "source", "meaning", "what the level does", "acknowledged", "since"],
      n.fault_list.map(f => [device(f), f.code, f.level, f.source, meaning(f.code), v.handling[f.level] || "", ackText(f.ack), ts(f.first_seen_ms)]), { id: "faults" })
      : h("p", { class: "muted" }, "no active fault"),
    h("h2", {}, "Jobs on this node"),
    jobRows.length ? table(["job", "namespace", "ranks here", "touched by"], jobRows, { id: "node-jobs" })
      : h("p", { class: "muted", id: "node-jobs-none" }, "no job has a rank on this node"),
    h("h2", {}, "Conditions"),
    n.conditions.length ? table(["type", "reason", "message"], n.conditions.map(c => [c.type, c.reason || "", c.message || ""]))
      : h("p", { class: "muted" }, "none (BMC and other sources report here when they fail)"),
    h("h2", {}, "Devices"),
    n.devices.length ? table(["device", "health"], n.devices.map(d => [device(d), d.health || ""])) : h("p", { class: "muted" }, "no device reported"),
    h("h2", {}, "History"),
    events.length ? h("div", {}, timeline(events.slice(-30).map(e => ({ t: e.ts_ms, color: kindColor[e.kind],
      label: `${e.kind} ${device(e)} ${e.code} ${e.level}` }))),
      table(["time", "change", "device", "code", "level", "source", "why"],
        events.slice().reverse().map(e => [ts(e.ts_ms), e.kind, device(e), e.code, e.level, e.source, why(e)]), { id: "history" }))
      : h("p", { class: "muted" }, "nothing happened on this node (within the kept history)"));
  // an acknowledged fault's row is marked (the table keeps the fault list's order)
  const rows = document.querySelectorAll("#faults tr");
  n.fault_list.forEach((f, i) => { if (f.ack && rows[i + 1]) rows[i + 1].classList.add("acked"); });
}

// -- jobs ----------------------------------------------------------------------------------------------
// What the brain is doing for a job: INIT is the reference's idle state (no flow running), shown
// with the last decision, not as a raw state name (issue 31: "recovery state INIT" after success).
function recoveryText(state, registered, flow, last) {
  const lastTxt = last ? `, last decision: ${last.flow} ${last.decision} (${ts(last.time_ms)})` : "";
  if (!registered) return `no Recover client registered${lastTxt}`;
  if (!state || state === "INIT") return `idle, no recovery running${lastTxt}`;
  return `recovering: ${flow || "flow"} at ${state}`;
}

async function jobsPage() {
  document.title = "faultmesh: jobs";
  const jobs = await getJSON("/v1/jobs");
  show(h("h1", {}, "Jobs"),
    jobs.length ? table(["job", "namespace", "health", "ranks", "faults", "recovery", "strategies"],
      jobs.map(j => [h("a", { href: `/ui/job/${encodeURIComponent(j.id)}` }, j.name), j.namespace, pill(j.health),
        j.ranks.length, j.fault_count, recoveryText(j.state, j.registered, "", null), (j.strategies || []).join(", ")]), { id: "jobs" })
      : h("p", { class: "muted" }, "no job known (faultmesh job apply, or a Recover client's Register)"));
}

// -- one job -----------------------------------------------------------------------------------------
async function jobPage(id) {
  document.title = `faultmesh: job ${id}`;
  // one fetch: the job, its recovery, the grid cells of its nodes and its slow-node status
  const v = await getJSON(`/v1/jobs/${encodeURIComponent(id)}/view`);
  const job = v.job, rec = v.recovery, cells = v.cells, st = v.slownode;
  const byNode = {};
  for (const r of job.ranks) (byNode[r.node] = byNode[r.node] || []).push(r);
  const devs = [...new Set(job.ranks.map(r => r.device))].sort((a, b) => a - b);
  const rankRows = Object.keys(byNode).sort().map(node => h("tr", {},
    h("td", { class: "name" }, h("a", { href: `/ui/node/${encodeURIComponent(node)}` }, node)),
    devs.map(d => {
      const r = byNode[node].find(x => x.device === d);
      const c = cells[node] && cells[node][String(d)];
      if (!r) return h("td", { class: "cell lv-none" }, "");
      return h("td", { class: `cell h-${c ? c.health : "Healthy"}${ackedClass(c && c.codes)}`, "data-node": node, "data-npu": d,
        ...cellAttrs(c && c.codes, `rank ${r.rank}: ${c && c.level ? c.level : "no fault"}`) }, r.rank);
    })));
  const parts = [h("h1", {}, `Job ${job.name} `, pill(job.health)),
    h("p", { class: "muted" }, `${job.namespace}/${job.name} id ${job.id}, ${job.ranks.length} ranks, strategies ${(job.strategies || []).join(", ") || "-"} `,
      h("a", { href: "/ui/jobs" }, "all jobs")),
    h("p", { id: "recovery" }, "recovery: " + recoveryText(rec.state, rec.registered, rec.flow, (rec.decisions || []).slice(-1)[0])),
    h("h2", {}, "Ranks on nodes (cell: rank, colour: NPU health)"),
    h("table", { class: "grid", id: "ranks" }, h("tr", {}, h("th", {}, "node"), devs.map(d => h("th", {}, `NPU ${d}`))), rankRows),
    h("h2", {}, "Recovery decisions")];
  const dec = rec.decisions || [];
  parts.push(dec.length ? h("div", { id: "decisions" }, timeline(dec.map(d => ({ t: d.time_ms, label: `${d.flow}: ${d.decision}`,
    color: d.decision.includes("fail") ? "var(--unhealthy)" : "var(--info)" }))),
    table(["time", "flow", "decision", "reason", "state"], dec.map(d => [ts(d.time_ms), d.flow, d.decision, d.reason, d.state])))
    : h("p", { class: "muted" }, "no recovery decision yet"));
  parts.push(h("h2", {}, "Slow node"));
  if (!st) parts.push(h("p", { class: "muted", id: "slownode-off" }, "slow-node detection is not enabled for this job"));
  else {
    const pattern = {};
    for (const res of Object.values(st.nodeResults || {})) Object.assign(pattern, res.pattern || {});
    const ranks = Object.keys(pattern).sort((a, b) => a - b);
    const slow = new Set([...(st.slowRanks || []), ...((st.cluster || {}).slowCalculateRanks || [])].map(String));
    // issue 31: "degraded" beside a latest round of 0.0% read as a contradiction: the confirmed state
    // is kept until as many clean rounds as confirmed it, the latest round is one round
    const n = (st.featConf || {}).nConsecSlowRoundsToConfirm, c = st.cluster || {};
    parts.push(h("p", { id: "slowsummary" }, `rounds ${st.rounds}; degradation confirmed: ` +
      (st.degraded ? `yes (until ${n || "?"} consecutive clean rounds)` : "no") +
      `, confirmed slow ranks [${(st.slowRanks || []).join(", ")}]; latest round: ` +
      `slow ranks [${(c.slowCalculateRanks || []).join(", ")}], degradation ${c.degradationLevel || "-"}`));
    if (ranks.length) {
      parts.push(h("div", { id: "slowplot" }, barChart(ranks, [
        { name: "compute / median", color: "#5b8def", values: ranks.map(r => pattern[r][0]) },
        { name: "wait / median", color: "#e8b023", values: ranks.map(r => pattern[r][1]) }],
        { title: "per-rank step time: compute and wait against the job's median (1.0 = median)", ref: 1, mark: slow, min_max: 1.2 })));
    } else {
      const conf = st.featConf || {};
      const why = Object.keys(st.nodeResults || {}).length === 0 ? "no node has reported a result yet"
        : (conf.rules && conf.rules !== "pattern") || conf.patternDetector === false
          ? `per-rank compute / wait ratios come from the pattern detector, which this job's rules ("${conf.rules || "?"}") do not run`
          : "the nodes' results carry no per-rank ratios yet (the pattern window is still filling)";
      parts.push(h("p", { class: "muted", id: "slowplot-none" }, why));
    }
    const results = Object.entries(st.nodeResults || {}).sort();
    if (results.length) parts.push(table(["node", "slow", "degradation", "last step", "baseline", "slow compute ranks", "detected by"],
      results.map(([node, r]) => [node, r.isSlow ? "yes" : "no", r.degradationLevel || "", r.lastStep ?? "", r.baselineReady ? "ready" : "learning",
        (r.slowCalculateRanks || []).join(","), (r.detectedBy || []).join(",")]), { id: "noderesults" }));
    const rounds = (st.history || []).slice(-40);
    if (rounds.length) parts.push(table(["round", "time", "slow", "slow ranks", "actions"],
      rounds.slice().reverse().map(r => [r.round, ts(r.ms), r.isSlow ? "yes" : "no", (r.slowCalculateRanks || []).join(","), (r.actions || []).join(",")])));
  }
  show(...parts);
}

// -- pingmesh ------------------------------------------------------------------------------------------
// Where an alarm lies, from the API's node / phyId / peerNode / peerPhyId / plane (issue 31: the
// page read a.phy, which the API does not send, and showed "node/").
function where(a) {
  const end = (node, phy) => (phy === null || phy === undefined) ? (node || "") : `${node || "?"} NPU ${phy}`;
  let w = end(a.node, a.phyId);
  if (a.peerNode || (a.peerPhyId !== null && a.peerPhyId !== undefined)) w += ` \u2192 ${end(a.peerNode, a.peerPhyId)}`;
  if (a.plane !== null && a.plane !== undefined) w += ` (plane ${a.plane})`;
  return w || (a.nodes || []).join(", ");
}

async function pingmeshPage() {
  document.title = "faultmesh: pingmesh";
  const pm = await getJSON("/v1/pingmesh");
  const parts = [h("h1", {}, "Pingmesh")];
  if (!pm.superPods.length) parts.push(h("p", { class: "muted" }, "no super pod topology loaded"));
  for (const sp of pm.superPods) {
    const m = (sp.latest && sp.latest.matrix) || [];
    const names = [...new Set(m.flatMap(x => [x.srcNode, x.dstNode]))].sort();
    const val = {};
    for (const x of m) val[`${x.srcNode}|${x.dstNode}`] = x.avgLossRate;
    parts.push(h("h2", {}, `Super pod ${sp.superPodId}: ${sp.nodes} nodes, ${sp.paths} paths`));
    parts.push(m.length ? h("div", { class: "heat", "data-superpod": sp.superPodId }, heatMap(names, names, (r, c) => {
      const v = val[`${r}|${c}`]; return v === undefined ? null : v; }))
      : h("p", { class: "muted" }, "no period analysed yet"));
    const rows = (sp.alarms || []).map(a => [`${a.kind} ${a.faultTypeName || ""}`.trim(), where(a), a.scope || "", ts(a.firstSeenMs)])
      .concat((sp.unreachableCards || []).map(c => ["unreachable card", where(c), "", ts(c.firstSeenMs)]));
    if (rows.length) parts.push(table(["kind", "where", "scope", "since"], rows, { class: "alarms", "data-superpod": sp.superPodId }));
  }
  show(...parts);
}

// -- router ----------------------------------------------------------------------------------------------
(function main() {
  const p = location.pathname;
  let m;
  if ((m = p.match(/^\/ui\/node\/(.+)$/))) refresh = () => nodePage(decodeURIComponent(m[1]));
  else if ((m = p.match(/^\/ui\/job\/(.+)$/))) refresh = () => jobPage(decodeURIComponent(m[1]));
  else if (p === "/ui/jobs") refresh = jobsPage;
  else if (p === "/ui/pingmesh") refresh = pingmeshPage;
  else refresh = gridPage;
  refresh().then(() => { document.body.dataset.ready = "1"; }).catch(e => { fail(e); document.body.dataset.ready = "1"; });
  live();
})();
