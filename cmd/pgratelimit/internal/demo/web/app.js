// The demo page: live state from /api/events (Server-Sent Events), requests
// to the rate-limited endpoints, the scenarios, the policy form, the
// credits card and the jobs card.
// Hand-written, no dependencies, no build step.
"use strict";

const $ = (id) => document.querySelector(`[data-testid="${id}"]`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let state = null; // the latest state from the server
let formGen = -1; // the policy generation the form shows
let sent = 0; // responses logged
const samples = []; // {t, tokens}, the last 30 s
const WINDOW_MS = 30000;

// ---- live state -----------------------------------------------------------

function connect() {
  const es = new EventSource("/api/events");
  es.onmessage = (e) => update(JSON.parse(e.data));
  es.onerror = () => showError("lost the event stream; reconnecting…");
}

function showError(msg) {
  const el = $("state-error");
  el.hidden = !msg;
  el.textContent = msg || "";
}

// fmtMs says a wait as the CLI does (package human), never shorter than
// the truth: "850ms" and "4.4s" (to the tenth, where the CLI gives the
// millisecond), "20s"; from a minute up in its two largest units of days,
// hours, minutes and seconds, rounded up to the second ("12m 5s", "3h 12m",
// "5d 14h"; "2h" when the second is 0).
function fmtMs(ms) {
  if (!(ms > 0)) return "0s";
  if (ms < 1000) return `${Math.ceil(ms)}ms`;
  if (Math.ceil(ms / 100) < 100) return `${(Math.ceil(ms / 100) / 10).toFixed(1)}s`;
  const units = [[86400000, "d"], [3600000, "h"], [60000, "m"], [1000, "s"]];
  const unit = ms < 3600000 ? 1000 : ms < 86400000 ? 60000 : 3600000;
  ms = Math.ceil(ms / unit) * unit;
  if (ms < 60000) return `${ms / 1000}s`;
  const i = units.findIndex(([size]) => ms >= size);
  const [size, name] = units[i];
  let s = `${Math.floor(ms / size)}${name}`;
  if (i + 1 < units.length) {
    const [next, nextName] = units[i + 1];
    const n = Math.floor((ms % size) / next);
    if (n) s += ` ${n}${nextName}`;
  }
  return s;
}

function update(st) {
  state = st;
  showError(st.error);
  const b = st.bucket, p = st.policy;
  $("key").textContent = st.key;
  $("remaining").textContent = String(b.tokens);
  $("capacity-now").textContent = String(b.capacity);
  const g = $("gauge");
  g.style.width = `${b.capacity ? (100 * b.tokens) / b.capacity : 0}%`;
  g.classList.toggle("empty", b.tokens === 0);
  $("when").textContent = b.tokens >= b.capacity
    ? "full"
    : `next refill (+${p.refill}) in ${fmtMs(b.next_refill_ms)} · full in ${fmtMs(b.full_in_ms)}`;
  $("minute").textContent = `${st.minute.tokens} of ${st.minute.capacity}`;
  $("minute-gauge").style.width = `${st.minute.capacity ? (100 * st.minute.tokens) / st.minute.capacity : 0}%`;
  showCredits(st.credits, st.key);
  showJobs(st.jobs, st.key);
  $("policy").textContent =
    `Capacity ${p.capacity}, Refill ${p.refill} every ${p.interval}, ${p.storage}: RateLimit-Policy: ${p.header}`;
  if (p.gen !== formGen) {
    formGen = p.gen;
    $("capacity").value = p.capacity;
    $("refill").value = p.refill;
    $("interval").value = p.interval;
    $("storage").value = p.storage;
    samples.length = 0;
  }
  const now = Date.now();
  samples.push({ t: now, tokens: b.tokens });
  while (samples.length && samples[0].t < now - WINDOW_MS - 1000) samples.shift();
  draw(now);
}

// keyPage is the operator UI's page of key under prefix.
const keyPage = (prefix, key) => `admin/key?prefix=${encodeURIComponent(prefix)}&key=${encodeURIComponent(key)}`;

// showCredits shows the credits scenario's quota and granted balance, and
// links to key's page in the operator UI for its grants, ledger and alerts.
function showCredits(c, key) {
  $("credits-prefix").textContent = c.prefix;
  $("credits-quota").textContent = String(c.quota);
  $("credits-capacity").textContent = String(c.capacity);
  const q = $("credits-quota-gauge");
  q.style.width = `${c.capacity ? (100 * c.quota) / c.capacity : 0}%`;
  q.classList.toggle("empty", c.quota === 0);
  $("credits-renews").textContent = c.quota >= c.capacity
    ? `full · renewed ${c.period}`
    : `back to ${c.capacity} in ${fmtMs(c.renews_in_ms)} · renewed ${c.period}`;
  $("credits-granted").textContent = String(c.granted);
  // Granted credits have no cap: the gauge is on the quota's scale.
  $("credits-granted-gauge").style.width = `${c.capacity ? Math.min(100, (100 * c.granted) / c.capacity) : 0}%`;
  $("credits-admin").href = keyPage(c.prefix, key);
}

// showJobs shows the jobs card: the slots the key's live leases hold, by
// what holds them (the demo's killed jobs, its running ones, another
// holder), then the free slots; each lease is on key's page in the
// operator UI.
function showJobs(j, key) {
  $("jobs-prefix").textContent = j.prefix;
  $("jobs-max").textContent = String(j.max);
  $("jobs-policy").textContent = `Max ${j.max} slots per key, TTL ${fmtMs(j.ttl_ms)}: a lease counts until released, or until ` +
    `${fmtMs(j.ttl_ms)} pass without an Extend. A job runs ${fmtMs(j.job_ms)} and extends its lease every ${fmtMs(j.heartbeat_ms)}. ` +
    `${j.held} of ${j.max} held.`;
  const slot = (n, state, ...parts) => {
    const li = document.createElement("li");
    li.dataset.testid = "jobs-slot";
    li.dataset.state = state;
    li.className = state;
    li.append(span("n", `slot ${n}`), ...parts.flatMap((p) => [" ", p]));
    return li;
  };
  const holders = [
    ["killed", j.killed, "killed: no heartbeat, no release", "back when its lease expires"],
    ["running", j.running, "job running", "extends its lease"],
    ["other", j.held - j.running - j.killed, "held by another holder (the CLI?)", "until released or expired"],
    ["free", j.max - j.held, "free", ""],
  ];
  const items = [];
  for (const [state, n, what, left] of holders) {
    for (let i = 0; i < n; i++) items.push(slot(items.length + 1, state, span("what", what), ...(left ? [span("left", left)] : [])));
  }
  $("jobs-slots").replaceChildren(...items);
  $("jobs-admin").href = keyPage(j.prefix, key);
}

// ---- the chart: tokens over the last 30 s, with the refill grid -----------

function draw(now) {
  const c = $("chart");
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth, h = c.clientHeight;
  if (c.width !== Math.round(w * dpr)) c.width = Math.round(w * dpr);
  if (c.height !== Math.round(h * dpr)) c.height = Math.round(h * dpr);
  const ctx = c.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  if (!state) return;
  const cap = state.bucket.capacity, pad = { l: 30, r: 8, t: 8, b: 18 };
  const x = (t) => pad.l + ((t - (now - WINDOW_MS)) / WINDOW_MS) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / cap) * (h - pad.t - pad.b);

  // Axes: 0 and Capacity, and seconds ago.
  ctx.fillStyle = "#667085";
  ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right";
  ctx.fillText(String(cap), pad.l - 6, y(cap) + 4);
  ctx.fillText("0", pad.l - 6, y(0) + 4);
  for (let s = 0; s <= 30; s += 10) {
    // "now" ends at the right edge rather than centred on it, where half of
    // it would be cut off.
    ctx.textAlign = s ? "center" : "right";
    ctx.fillText(s ? `-${s}s` : "now", x(now - s * 1000) + (s ? 0 : pad.r), h - 4);
  }
  ctx.strokeStyle = "#e3e6eb";
  ctx.beginPath();
  ctx.moveTo(pad.l, y(0)); ctx.lineTo(w - pad.r, y(0));
  ctx.moveTo(pad.l, y(cap)); ctx.lineTo(w - pad.r, y(cap));
  ctx.stroke();

  // The refill grid: the next refill, and every Interval before it.
  // Only since the bucket was last full: a full bucket's grid starts anew
  // at its next check.
  const iv = state.policy.interval_ms, next = state.bucket.next_refill_ms;
  let since = now - WINDOW_MS;
  for (const s of samples) if (s.tokens >= cap) since = s.t;
  if (next > 0 && iv > 0 && (iv / WINDOW_MS) * (w - pad.l - pad.r) >= 4) {
    ctx.strokeStyle = "#c9d3e6";
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    for (let t = state.time_ms + next; t > since; t -= iv) {
      if (t > now) continue;
      ctx.moveTo(x(t), pad.t); ctx.lineTo(x(t), y(0));
    }
    ctx.stroke();
    ctx.setLineDash([]);
  }

  // Tokens, as steps.
  if (samples.length) {
    ctx.beginPath();
    let first = true;
    for (let i = 0; i < samples.length; i++) {
      const s = samples[i], xs = Math.max(x(s.t), pad.l);
      if (first) { ctx.moveTo(xs, y(s.tokens)); first = false; continue; }
      ctx.lineTo(xs, y(samples[i - 1].tokens));
      ctx.lineTo(xs, y(s.tokens));
    }
    ctx.lineTo(x(now), y(samples[samples.length - 1].tokens));
    ctx.strokeStyle = "#2458d6";
    ctx.lineWidth = 2;
    ctx.stroke();
    ctx.lineWidth = 1;
  }
}

// ---- requests and the log -------------------------------------------------

function logNote(text, bad) {
  const li = document.createElement("li");
  li.className = bad ? "note bad" : "note";
  li.textContent = text;
  appendLog(li);
}

function appendLog(li) {
  const ol = $("log");
  ol.appendChild(li);
  while (ol.children.length > 300) ol.removeChild(ol.firstChild);
  ol.scrollTop = ol.scrollHeight;
}

function span(cls, text) {
  const s = document.createElement(cls === "code" ? "code" : "span");
  if (cls !== "code") s.className = cls;
  s.textContent = text;
  return s;
}

// send makes one request to path with cost, logs the response with its
// RateLimit headers (and the message of a JSON answer), and returns
// {status, limit, json} (limit: the policy named in the RateLimit header).
async function send(cost, path = "/api/limited", method = "GET") {
  const n = ++sent, t0 = performance.now();
  const li = document.createElement("li");
  li.dataset.testid = "result";
  const parts = [span("n", `#${n}`)];
  let res;
  try {
    const r = await fetch(`${path}?cost=${encodeURIComponent(cost)}`, { method, cache: "no-store" });
    const body = await r.text();
    res = { status: r.status, limit: (r.headers.get("RateLimit") || "").split(";")[0].replaceAll('"', "") };
    if ((r.headers.get("Content-Type") || "").startsWith("application/json")) res.json = JSON.parse(body);
    li.className = r.status === 200 ? "ok" : r.status === 429 ? "no" : "err";
    parts.push(span("st", `${r.status} ${r.statusText}`), span("what", `cost ${cost}`));
    for (const h of ["RateLimit", "Retry-After"]) {
      const v = r.headers.get(h);
      if (v) parts.push(span("code", `${h}: ${v}`));
    }
    if (res.json) parts.push(span("what", res.json.message || res.json.error || ""));
    else if (r.status !== 200 && r.status !== 429) parts.push(span("what", body.trim()));
  } catch (e) {
    res = { status: 0, limit: "" };
    li.className = "err";
    parts.push(span("st", "failed"), span("what", String(e)));
  }
  parts.push(span("ms", `${Math.round(performance.now() - t0)} ms`));
  parts.forEach((p, i) => li.append(...(i ? [" ", p] : [p])));
  appendLog(li);
  return res;
}

async function post(path, form) {
  const r = await fetch(path, { method: "POST", body: form ? new URLSearchParams(form) : undefined });
  const v = await r.json();
  if (!r.ok) throw new Error(v.error || `${r.status} ${r.statusText}`);
  return v;
}

// cost is the Cost field as typed (1 when empty): a cost below 1 is sent
// as it is, and the server refuses it (400), as it would any client's.
function cost() {
  return $("cost").value.trim() || "1";
}

// busy disables the buttons while fn runs, and reports what it returns in
// the status line status.
async function busy(fn, status = "scenario-status") {
  const buttons = document.querySelectorAll("button:not([data-testid=clear])");
  buttons.forEach((b) => (b.disabled = true));
  try {
    const msg = await fn();
    if (msg) $(status).textContent = msg;
  } catch (e) {
    $(status).textContent = String(e.message || e);
    logNote(String(e.message || e), true);
  } finally {
    buttons.forEach((b) => (b.disabled = false));
  }
}

async function refill() {
  const v = await post("/api/reset");
  logNote(`bucket refilled: ${v.tokens} tokens`);
}

async function burst(n, c) {
  const counts = { 200: 0, 429: 0, other: 0 };
  for (let i = 0; i < n; i++) {
    const r = await send(c);
    counts[r.status === 200 || r.status === 429 ? r.status : "other"]++;
  }
  return counts;
}

// The credits scenario's steps; each returns what happened, in words.
const credits = {
  async reset() {
    const v = await post("/api/credits/reset");
    logNote(v.message);
    return v.message;
  },
  // charge charges c credits and returns the answer: 200 or 429, with a
  // message either way.
  async charge(c) {
    const r = await send(c, "/api/credits/charge", "POST");
    if ((r.status !== 200 && r.status !== 429) || !r.json) throw new Error(r.json?.error || `charge failed (${r.status})`);
    return r;
  },
  async useUp() {
    await credits.reset();
    for (let ok = 0; ok < 1000; ok++) {
      const r = await credits.charge(7);
      if (r.status === 429) {
        return `Quota used up: ${ok} charges of 7 passed, then 429 Too Many Requests. ${r.json.message}`;
      }
      $("credits-status").textContent = `Using up the quota: ${ok + 1} charges of 7 passed…`;
    }
    return "The quota did not run out after 1000 charges.";
  },
  async grant(amount, expiresIn = "") {
    const v = await post("/api/credits/grant", { amount, expires_in: expiresIn });
    logNote(v.message);
    return v.message;
  },
  async chargeOne(c) {
    const r = await credits.charge(c);
    return r.status === 200 ? r.json.message : `429 Too Many Requests. ${r.json.message}`;
  },
};

// The jobs card's actions; each returns what happened, in words.
const jobs = {
  async start() {
    const r = await send(1, "/api/jobs/start", "POST");
    if ((r.status !== 200 && r.status !== 429) || !r.json) throw new Error(r.json?.error || `start failed (${r.status})`);
    return r.status === 200 ? r.json.message : `429 Too Many Requests. ${r.json.message}`;
  },
  async kill() {
    const v = await post("/api/jobs/kill");
    logNote(v.message);
    return v.message;
  },
  async reset() {
    const v = await post("/api/jobs/reset");
    logNote(v.message);
    return v.message;
  },
};

const scenarios = {
  async burst() {
    await refill();
    const cap = state.policy.capacity, n = Math.min(cap + 3, 200);
    const c = await burst(n, 1);
    return `Burst of ${n} from a full bucket of ${cap}: ${c[200]} allowed (200), ${c[429]} denied (429).`;
  },
  async steady() {
    const p = state.policy, period = Math.max(50, p.interval_ms / p.refill / 0.9);
    if (period > 5000) return `Refills are too slow to watch (one every ${fmtMs(Math.round(p.interval_ms / p.refill))}): try Interval 1s.`;
    await refill();
    let ok = 0;
    const n = 12;
    for (let i = 1; i <= n; i++) {
      const r = await send(1);
      if (r.status === 200) ok++;
      $("scenario-status").textContent = `Steady: ${i} of ${n} sent, one every ${fmtMs(Math.round(period))}; ${ok} allowed…`;
      if (i < n) await sleep(period);
    }
    return `Steady, at 90% of the refill rate: ${ok} of ${n} allowed.`;
  },
  async twoLimits() {
    await refill();
    const p = state.policy, n = Math.min(3 * p.capacity, 30);
    const period = Math.min(1000, Math.max(100, p.interval_ms / p.refill / 2));
    const by = {};
    let ok = 0;
    for (let i = 1; i <= n; i++) {
      const r = await send(1, "/api/two-limits");
      if (r.status === 200) ok++;
      else by[r.limit] = (by[r.limit] || 0) + 1;
      $("scenario-status").textContent = `Two limits: ${i} of ${n} sent; ${ok} allowed…`;
      if (i < n) await sleep(period);
    }
    const denied = Object.entries(by).map(([k, v]) => `${v} by "${k}"`).join(", ") || "none";
    return `Two limits: ${ok} of ${n} allowed; denied: ${denied}. Requests denied by one limit took nothing from the other.`;
  },
  async rollback() {
    await refill();
    const c = Math.min(Number(cost()) > 1 ? Number(cost()) : 3, state.policy.capacity);
    const v = await post(`/api/scenario/rollback?cost=${c}`);
    const charged = v.allowed
      ? `charged ${v.cost} inside a transaction (${v.before} → ${v.in_tx} tokens, seen inside it)`
      : `the charge of ${v.cost} was denied inside the transaction`;
    const msg = `Rollback: ${charged}; then its work failed (${v.failure}) and it rolled back: ` +
      `the bucket has ${v.after} of ${v.capacity}, nothing spent.`;
    logNote(msg);
    return msg;
  },
  // credits runs the credits card's three steps, with a pause between them
  // to watch the gauges.
  async credits() {
    const steps = [
      ["1/3", () => credits.useUp()],
      ["2/3", () => credits.grant(10)],
      ["3/3", () => credits.chargeOne(4)],
    ];
    let msg = "";
    for (const [i, [n, step]] of steps.entries()) {
      msg = await step();
      $("credits-status").textContent = msg;
      $("scenario-status").textContent = `Credits, step ${n}: ${msg}`;
      if (i < steps.length - 1) await sleep(1200);
    }
    return `Credits: used up the quota, granted 10, charged 4. ${msg}`;
  },
};

$("send").addEventListener("click", () => busy(async () => { await send(cost()); }));
$("send-burst").addEventListener("click", () => busy(async () => {
  const n = Math.min(200, Math.max(1, parseInt($("burst-size").value, 10) || 1));
  const c = await burst(n, cost());
  return `Burst of ${n}: ${c[200]} allowed, ${c[429]} denied${c.other ? `, ${c.other} other` : ""}.`;
}));
$("reset").addEventListener("click", () => busy(refill));
$("scenario-burst").addEventListener("click", () => busy(scenarios.burst));
$("scenario-steady").addEventListener("click", () => busy(scenarios.steady));
$("scenario-two-limits").addEventListener("click", () => busy(scenarios.twoLimits));
$("scenario-rollback").addEventListener("click", () => busy(scenarios.rollback));
$("scenario-credits").addEventListener("click", () => busy(scenarios.credits));
$("credits-use-up").addEventListener("click", () => busy(credits.useUp, "credits-status"));
$("credits-grant-10").addEventListener("click", () => busy(() => credits.grant(10), "credits-status"));
$("credits-charge-4").addEventListener("click", () => busy(() => credits.chargeOne(4), "credits-status"));
$("credits-charge").addEventListener("click", () => busy(() =>
  credits.chargeOne($("credits-cost").value.trim() || "1"), "credits-status"));
$("credits-grant").addEventListener("click", () => busy(() =>
  credits.grant(Math.max(1, parseInt($("credits-amount").value, 10) || 1), $("credits-expires").value), "credits-status"));
$("credits-reset").addEventListener("click", () => busy(credits.reset, "credits-status"));
$("jobs-start").addEventListener("click", () => busy(jobs.start, "jobs-status"));
$("jobs-kill").addEventListener("click", () => busy(jobs.kill, "jobs-status"));
$("jobs-reset").addEventListener("click", () => busy(jobs.reset, "jobs-status"));
$("clear").addEventListener("click", () => { $("log").replaceChildren(); });
$("policy-form").addEventListener("submit", (e) => {
  e.preventDefault();
  busy(async () => {
    const p = await post("/api/policy", new FormData(e.target));
    formGen = -1; // show the new policy in the form
    const msg = `Applied: Capacity ${p.capacity}, Refill ${p.refill} every ${p.interval}, ${p.storage}. A new limiter, a fresh bucket.`;
    logNote(msg);
    return msg;
  });
});
window.addEventListener("resize", () => draw(Date.now()));

connect();
