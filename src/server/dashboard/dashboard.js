// The live dashboard: polls GET /admin/state once a second, keeps the last five minutes in the
// page, and redraws six uPlot charts and the backend table. No build step, nothing from the
// internet: uPlot is served by the gateway from its installed package (/dashboard/uplot.js).
//
// A figure the gateway did not measure (a null in /admin/state) is a gap in a chart and "–" in
// the table, never a 0; so is a poll that failed or got no answer within POLL_TIMEOUT_MS (the
// banner says so), and no rate is drawn across it. Rates (requests per second by decision) come
// from the difference of two polls' counters, so the first poll draws none.
//
// For tests and the curious: window.slagateDashboard holds the charts, the poll count and the
// last state.
/* global uPlot */
'use strict';

const POLL_MS = 1000;
/** A poll not answered by then has failed: a stuck gateway must not leave old figures on screen as current. */
const POLL_TIMEOUT_MS = 3 * POLL_MS;
const KEEP = 300;
const PALETTE = [
  '#3b6fd8', '#d84b3b', '#2f9e44', '#b06000', '#7b3fd8', '#0b8a8a', '#c2255c', '#5c7cfa',
  '#868e96', '#e8590c', '#1098ad', '#8ce99a', '#845ef7', '#f08c00', '#364fc7', '#a61e4d',
];
const TARGET_COLOR = '#1d2330';

const history = { t: [], rows: [] };
let prevCounts = null;
/** The previous counts' reading on the gateway's clock (uptime_ms), ms; and their receipt here, s. */
let prevUptimeMs = null;
let prevT = null;
/** The instance the previous counts came from: counts are per instance, so rates are too. */
let prevInstance = null;
const charts = {};
const dash = { polls: 0, charts, state: null, errors: 0 };
window.slagateDashboard = dash;

const $ = (id) => document.getElementById(id);
/** `obj[key]` when it is obj's own: a class or backend may be named like a method of every object (`toString`). */
const own = (obj, key) => (Object.hasOwn(obj, key) ? obj[key] : undefined);
const fmt = (v, digits = 0) => (v === null || v === undefined || Number.isNaN(v) ? '–' : v.toFixed(digits));

/** One row of history from one state: every series value keyed by chart and series name. */
function sample(s, t) {
  const row = { ttft: {}, tpot: {}, queue: {}, decisions: {}, inflight: {}, kv: {} };
  let inflight = 0;
  let limit = 0;
  let anyLimit = false;
  for (const b of s.backends) {
    inflight += b.inflight?.requests ?? b.local_inflight;
    // A backend a reload removed, still draining, has only its attempts to show: its name may be a
    // new server's already, whose series these are.
    if (b.state === 'removed') continue;
    row.ttft[b.name] = b.latency?.ttft.p99 ?? null;
    row.tpot[b.name] = b.latency?.tpot.p99 ?? null;
    const kv = kvNow(b);
    row.kv[b.name] = kv === null ? null : 100 * kv;
    // The sum is measured once any backend has a limit: 0 when none of them is available (a fleet
    // down is a line at 0, not a gap).
    if (b.concurrency_limit !== null) {
      anyLimit = true;
      if (b.available) limit += b.concurrency_limit;
    }
  }
  row.inflight['in flight'] = inflight;
  row.inflight['limit (available backends)'] = anyLimit ? limit : null;
  const hit = s.admission.prefix_hit_ratio;
  row.kv['prefix hit (this instance)'] = hit === null ? null : 100 * hit;
  for (const [cls, target] of Object.entries(s.sla.classes)) {
    row.ttft[`${cls} target`] = target.ttft_p99_ms;
    row.tpot[`${cls} target`] = target.tpot_p99_ms;
    row.queue[cls] = own(s.scheduler.queue_by_class, cls) ?? 0;
  }
  // A class a reload removed while its requests still wait.
  for (const [cls, n] of Object.entries(s.scheduler.queue_by_class)) row.queue[cls] = n;
  const counts = s.admission.requests;
  // A rate is a difference of one instance's counters. Behind a load balancer two polls may reach
  // two instances, and a restarted instance counts from 0 again: those polls draw no rate rather
  // than one instance's total minus another's.
  // Over the time between the two readings on the gateway's clock: a poll answered late (a slow
  // network, a busy browser) would otherwise stretch one interval and squeeze the next. A gateway
  // too old to say (no uptime_ms, mid-upgrade) is read by the times its answers came.
  const gatewayClock = typeof s.uptime_ms === 'number' && typeof prevUptimeMs === 'number';
  const dt = gatewayClock ? (s.uptime_ms - prevUptimeMs) / 1000 : t - prevT;
  if (prevCounts !== null && dt > 0 && s.instance === prevInstance && !countsFell(prevCounts, counts)) {
    for (const decision of ['admitted', 'refused']) {
      const now = counts[decision];
      const before = prevCounts[decision];
      const reasons = new Set([...Object.keys(now), ...Object.keys(before)]);
      if (decision === 'admitted') {
        let sum = 0;
        for (const r of reasons) sum += (now[r] ?? 0) - (before[r] ?? 0);
        row.decisions.admitted = sum / dt;
      } else {
        for (const r of reasons) row.decisions[`refused: ${r}`] = ((now[r] ?? 0) - (before[r] ?? 0)) / dt;
      }
    }
  }
  prevCounts = structuredClone(counts);
  prevUptimeMs = s.uptime_ms;
  prevT = t;
  prevInstance = s.instance;
  return row;
}

/** Whether any counter went down between two polls (the instance restarted). */
function countsFell(before, now) {
  for (const decision of ['admitted', 'refused']) {
    for (const [reason, n] of Object.entries(before[decision])) {
      if ((now[decision][reason] ?? 0) < n) return true;
    }
  }
  return false;
}

/** Series names of one chart over the whole history, in first-seen order. */
function seriesNames(key) {
  const names = [];
  const seen = new Set();
  for (const row of history.rows) {
    for (const name of Object.keys(row[key])) {
      if (!seen.has(name)) {
        seen.add(name);
        names.push(name);
      }
    }
  }
  return names;
}

function chartWidth(el) {
  return Math.max(320, el.parentElement.clientWidth - 16);
}

/** `log`: a log y axis, so targets seconds apart and latencies of milliseconds share one chart. */
function draw(key, elId, log = false) {
  const el = $(elId);
  const names = seriesNames(key);
  const data = [history.t, ...names.map((n) => history.rows.map((r) => own(r[key], n) ?? null))];
  const chart = charts[key];
  const sameSeries = chart && chart.names.join('\n') === names.join('\n');
  if (sameSeries) {
    chart.plot.setData(data);
    return;
  }
  if (chart) chart.plot.destroy();
  let colour = 0;
  const series = [
    {},
    ...names.map((n) => {
      const target = n.endsWith(' target');
      return {
        label: n,
        stroke: target ? TARGET_COLOR : PALETTE[colour++ % PALETTE.length],
        dash: target ? [6, 4] : undefined,
        width: target ? 1 : 1.5,
        spanGaps: false,
        points: { show: false },
        value: (_u, v) => fmt(v, 1),
      };
    }),
  ];
  const plot = new uPlot(
    {
      width: chartWidth(el),
      height: 220,
      series,
      scales: {
        x: { time: true },
        y: log ? { distr: 3 } : { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] },
      },
      legend: { live: true },
      axes: [{}, { size: 70 }],
    },
    data,
    el,
  );
  charts[key] = { plot, names };
}

function stateCell(b) {
  const td = document.createElement('td');
  td.textContent = b.state + ejection(b);
  td.className = `state-${b.state}`;
  return td;
}

/**
 * An ejection under way, whatever state shows first (a failing probe says down): how many times
 * outlier detection counts it ejected when that is more than once (a backend that keeps failing,
 * each ejection longer), and the seconds left of this one. Nothing when it is not ejected.
 */
function ejection(b) {
  if (b.ejected_for_ms == null) return '';
  const times = b.ejections > 1 ? ` ×${b.ejections}` : '';
  const left = `${Math.ceil(b.ejected_for_ms / 1000)} s left`;
  return b.state === 'ejected' ? `${times}, ${left}` : ` (ejected${times}, ${left})`;
}

function barCell(value, max, text) {
  const td = document.createElement('td');
  td.className = 'num';
  if (value !== null && max !== null && max > 0) {
    const bar = document.createElement('span');
    bar.className = value >= max ? 'bar full' : 'bar';
    const fill = document.createElement('span');
    fill.style.width = `${Math.min(100, (100 * value) / max)}%`;
    bar.append(fill);
    td.append(bar);
  }
  td.append(text);
  return td;
}

function textCell(text, over = false) {
  const td = document.createElement('td');
  td.className = over ? 'num over' : 'num';
  td.textContent = text;
  return td;
}

/** True when some class's P99 on this backend is over that class's own target. */
function overTarget(s, b, metric, targetKey) {
  return Object.entries(b.by_class ?? {}).some(([cls, lat]) => {
    const target = own(s.sla.classes, cls)?.[targetKey];
    const p99 = lat?.[metric]?.p99 ?? null;
    return target !== undefined && p99 !== null && p99 > target;
  });
}

function renderTable(s) {
  const tbody = $('backends').tBodies[0];
  const rows = s.backends.map((b) => {
    const tr = document.createElement('tr');
    tr.dataset.backend = b.name;
    const name = document.createElement('td');
    name.textContent = b.name;
    name.title = b.url;
    const inflight = b.inflight?.requests ?? b.local_inflight;
    const kv = kvNow(b);
    const lat = b.latency;
    const ttft99 = lat?.ttft.p99 ?? null;
    const tpot99 = lat?.tpot.p99 ?? null;
    tr.append(
      name,
      stateCell(b),
      barCell(inflight, b.concurrency_limit, `${inflight} / ${fmt(b.concurrency_limit)}`),
      barCell(kv === null ? null : 100 * kv, 100, kv === null ? '–' : `${fmt(100 * kv)}%`),
      textCell(`${fmt(lat?.ttft.p50 ?? null)} / ${fmt(ttft99)}`, overTarget(s, b, 'ttft', 'ttft_p99_ms')),
      textCell(`${fmt(lat?.tpot.p50 ?? null, 1)} / ${fmt(tpot99, 1)}`, overTarget(s, b, 'tpot', 'tpot_p99_ms')),
      textCell(String(lat?.requests ?? '–')),
      textCell(fmt(b.rates?.prefillTokensPerS ?? null)),
    );
    return tr;
  });
  tbody.replaceChildren(...rows);
}

/** The backend's KV usage as it reports it now; null when unknown (never scraped, or the scrape stale). */
function kvNow(b) {
  const t = b.telemetry;
  return t === null || t === undefined || t.saturated ? null : (t.kvCacheUsage ?? null);
}

function renderStatus(s) {
  $('s-instance').textContent = s.instance;
  $('s-router').textContent = s.router.policy;
  $('s-scheduler').textContent = s.scheduler.policy;
  $('s-queued').textContent = String(s.scheduler.queued + s.scheduler.retries);
  $('s-inflight').textContent = String(s.in_flight);
  const st = s.store;
  $('s-store').textContent = st.store === 'memory' ? 'memory' : `redis, ${st.degraded ? 'DEGRADED' : 'ok'}, ${st.peers} peers`;
  $('s-store').className = st.degraded ? 'over' : '';
  const hit = s.admission.prefix_hit_ratio;
  $('s-prefix').textContent = hit === null ? '–' : `${(100 * hit).toFixed(1)}%`;
  $('s-updated').textContent = new Date().toLocaleTimeString();
}

/**
 * After a failed poll: what the table and the header showed is no longer known. Each backend keeps
 * its row and name, every figure becomes "–" and its state "unknown"; the header keeps what names
 * the gateway (instance, policies) and the time of the last poll that was answered.
 */
function renderUnknown() {
  for (const tr of $('backends').tBodies[0].rows) {
    const [, state, ...figures] = tr.cells;
    state.textContent = 'unknown';
    state.className = 'state-unknown';
    for (const td of figures) {
      td.replaceChildren('–');
      td.className = 'num';
    }
  }
  for (const id of ['s-queued', 's-inflight', 's-store', 's-prefix']) {
    $(id).textContent = '–';
    $(id).className = '';
  }
}

/** The charts, redrawn from the history. */
function drawAll() {
  draw('ttft', 'c-ttft', true);
  draw('tpot', 'c-tpot', true);
  draw('decisions', 'c-decisions');
  draw('queue', 'c-queue');
  draw('inflight', 'c-inflight');
  draw('kv', 'c-kv');
}

/** Appends a row to the history (its last KEEP rows are kept). */
function keep(t, row) {
  history.t.push(t);
  history.rows.push(row);
  if (history.t.length > KEEP) {
    history.t.shift();
    history.rows.shift();
  }
}

async function poll() {
  try {
    const res = await fetch('/admin/state', { cache: 'no-store', signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
    if (!res.ok) throw new Error(`GET /admin/state: ${res.status}`);
    const s = await res.json();
    const t = Date.now() / 1000;
    keep(t, sample(s, t));
    renderStatus(s);
    renderTable(s);
    drawAll();
    $('error').hidden = true;
    dash.state = s;
    dash.polls++;
  } catch (err) {
    dash.errors++;
    $('error').hidden = false;
    $('error').textContent = `gateway unreachable: ${err.message}`;
    // Nothing was measured: a gap in every chart, and no rate across it.
    keep(Date.now() / 1000, { ttft: {}, tpot: {}, queue: {}, decisions: {}, inflight: {}, kv: {} });
    renderUnknown();
    prevCounts = null;
    prevInstance = null;
    if (Object.keys(charts).length > 0) drawAll();
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

window.addEventListener('resize', () => {
  for (const { plot } of Object.values(charts)) plot.setSize({ width: chartWidth(plot.root.parentElement), height: 220 });
});

poll();
