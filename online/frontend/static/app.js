// livevec live page: neighbours as you type, training stats and a words/s chart.
// Plain browser JavaScript, no build step and no external libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { query: "", seq: 0, controller: null, lastStats: null };

function fmt(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (a >= 100) return Math.round(n).toString();
  return (Math.round(n * 10) / 10).toString();
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return Math.round(seconds * 1000) + " ms";
  if (seconds < 90) return seconds.toFixed(1) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

async function getJSON(url, signal, init = {}) {
  const response = await fetch(url, { signal, ...init, headers: { Accept: "application/json", ...(init.headers || {}) } });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { ok: response.ok, status: response.status, body };
}

// Lists of words go in a JSON body: a word may hold any character, commas included.
function postJSON(url, data, signal) {
  return getJSON(url, signal, { method: "POST", body: JSON.stringify(data),
                                headers: { "Content-Type": "application/json" } });
}

function renderNeighbours(list, neighbours) {
  list.replaceChildren();
  const top = neighbours.length ? Math.max(...neighbours.map((n) => n.score), 1e-9) : 1;
  neighbours.forEach((n, i) => {
    const li = document.createElement("li");
    const rank = document.createElement("span");
    rank.className = "rank";
    rank.textContent = String(i + 1);
    const word = document.createElement("span");
    word.className = "word";
    word.textContent = n.word;
    word.title = "show the neighbours of " + n.word;
    word.addEventListener("click", () => { $("q").value = n.word; search(); });
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = Math.max(0, Math.min(100, (n.score / top) * 100)).toFixed(1) + "%";
    bar.appendChild(fill);
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = n.score.toFixed(3);
    li.append(rank, word, bar, score);
    list.appendChild(li);
  });
}

function showEmpty(list, text) {
  list.replaceChildren();
  const li = document.createElement("li");
  li.className = "empty";
  li.textContent = text;
  list.appendChild(li);
}

function renderSuggestions(words) {
  const box = $("suggestions");
  box.replaceChildren();
  words.forEach((w) => {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip";
    chip.textContent = w.word;
    if (w.count) {
      const small = document.createElement("small");
      small.textContent = fmt(w.count);
      chip.appendChild(small);
    }
    chip.addEventListener("click", () => { $("q").value = w.word; search(); });
    box.appendChild(chip);
  });
}

// One search per keystroke; older answers are dropped (sequence number + abort).
async function search(quiet = false) {
  const q = $("q").value.trim();
  state.query = q;
  const seq = ++state.seq;
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  const list = $("neighbours");
  if (!q) {
    list.replaceChildren();
    renderSuggestions([]);
    $("result-meta").textContent = "";
    return;
  }
  const k = $("k").value;
  try {
    const [sim, voc] = await Promise.all([
      getJSON(`/v1/similar?word=${encodeURIComponent(q)}&k=${k}`, controller.signal),
      quiet ? Promise.resolve(null)
            : getJSON(`/v1/vocab?prefix=${encodeURIComponent(q.toLowerCase())}&limit=8`, controller.signal),
    ]);
    if (seq !== state.seq) return;
    if (voc && voc.ok) renderSuggestions(voc.body.words.filter((w) => w.word !== q));
    if (sim.ok) {
      renderNeighbours(list, sim.body.neighbours);
      $("result-meta").textContent = `neighbours of “${sim.body.word}” · model version ${sim.body.version}`;
      followDrift(sim.body.word);
    } else if (sim.status === 404) {
      showEmpty(list, `“${q}” is not in the vocabulary (yet)` + (voc && voc.body && voc.body.total ? " — did you mean one of these?" : ""));
      $("result-meta").textContent = "";
    } else if (sim.body && sim.body.message) {
      showEmpty(list, sim.body.message);
    }
  } catch (e) {
    if (e.name !== "AbortError" && seq === state.seq) showEmpty(list, "the server did not answer");
  }
}

let typingTimer = null;
function onType() {
  clearTimeout(typingTimer);
  typingTimer = setTimeout(() => search(false), 60);
}

async function analogy(event) {
  event.preventDefault();
  const a = $("an-a").value.trim(), b = $("an-b").value.trim(), c = $("an-c").value.trim();
  const out = $("analogy-result");
  if (!a || !c) { showEmpty(out, "fill in a and c"); return; }
  const r = await postJSON("/v1/analogy", { positive: [a, c], negative: b ? [b] : [], k: 5 });
  if (r.ok) renderNeighbours(out, r.body.neighbours);
  else showEmpty(out, (r.body && r.body.message) || "no answer");
}

// ------------------------------------------------------------------ stats + chart
function drawChart(history) {
  const W = 600, H = 160, pad = 6;
  const points = history.filter((p) => typeof p.words_per_second === "number");
  const grid = $("chart-grid");
  grid.replaceChildren();
  for (let i = 1; i < 4; i++) {
    const y = (H / 4) * i;
    const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
    line.setAttribute("x1", 0); line.setAttribute("x2", W);
    line.setAttribute("y1", y); line.setAttribute("y2", y);
    grid.appendChild(line);
  }
  if (points.length < 2) {
    $("chart-line").setAttribute("d", "");
    $("chart-area").setAttribute("d", "");
    $("chart-max").textContent = points.length ? "collecting…" : "no training statistics from this source";
    return;
  }
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const span = Math.max(t1 - t0, 1e-6);
  const max = Math.max(...points.map((p) => p.words_per_second), 1);
  const xy = points.map((p) => [
    ((p.t - t0) / span) * W,
    H - pad - (p.words_per_second / max) * (H - 2 * pad),
  ]);
  const line = xy.map(([x, y], i) => (i ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1)).join(" ");
  $("chart-line").setAttribute("d", line);
  $("chart-area").setAttribute("d", line + ` L${W} ${H} L0 ${H} Z`);
  $("chart-max").textContent = `peak ${fmt(max)} words/s · last ${fmtAge(span)}`;
}

// The workers' training signal (GET /v1/stats "training"): red when some worker's hot rows are beyond the
// bound the LivevecTrainingDiverging alert uses, or overflowed (a garbage model still answers queries).
function renderTraining(t) {
  const tiles = ["stat-loss", "stat-norm", "stat-norm-max"].map($);
  const h = t && t.hot_row_norm;
  const worst = (stat) => {
    const values = h ? ["input", "output"].map((k) => h[k] && h[k][stat]).filter((v) => typeof v === "number") : [];
    return values.length ? Math.max(...values) : null;
  };
  const loss = t && typeof t.loss === "number" ? (t.loss < 100 ? t.loss.toFixed(2) : fmt(t.loss)) : "–";
  tiles[0].textContent = t && t.nonfinite_batches ? "overflow" : loss;
  tiles[1].textContent = t && t.nonfinite_rows ? "overflow" : fmt(worst("mean"));
  tiles[2].textContent = t && t.nonfinite_rows ? "overflow" : fmt(worst("max"));
  tiles.forEach((e) => e.classList.toggle("alarm", Boolean(t && t.diverging)));
  tiles[1].parentElement.title = h
    ? `mean row length of the 100 most frequent words, worst worker: input ${fmt(h.input && h.input.mean)}, ` +
      `output ${fmt(h.output && h.output.mean)}; healthy 1 to 5, diverging beyond ${t.hot_row_norm_bound}`
    : "no worker reports its hot rows";
}

async function refreshStats() {
  try {
    const r = await getJSON("/v1/stats");
    if (!r.ok) throw new Error("status " + r.status);
    const s = r.body;
    state.lastStats = s;
    $("stat-wps").textContent = fmt(s.words_per_second);
    $("stat-vocab").textContent = fmt(s.vocab_size);
    $("stat-lag").textContent = fmt(s.kafka_lag);
    $("stat-fresh").textContent = fmtAge(s.freshness_seconds);
    $("stat-trained").textContent = fmt(s.words_trained);
    $("stat-version").textContent = String(s.version);
    renderTraining(s.training);
    const stale = !s.sync.source_reachable;
    $("stat-fresh").classList.toggle("stale", stale && s.ready);
    const status = $("status");
    if (!s.ready) {
      status.className = "pill pill-wait"; status.textContent = "waiting for a model";
    } else if (stale) {
      status.className = "pill pill-bad"; status.textContent = "source unreachable · serving last copy";
    } else if (s.training && s.training.diverging) {
      status.className = "pill pill-bad"; status.textContent = `live · v${s.version} · training diverges`;
    } else {
      status.className = "pill pill-ok"; status.textContent = `live · v${s.version}`;
    }
    $("sync-note").textContent = s.sync.last_error && stale
      ? `last sync error: ${s.sync.last_error}`
      : `synced every ${s.sync.interval_seconds}s · last sync ${s.sync.last_sync_ms ?? "–"} ms, ${s.sync.last_delta_rows} rows`;
    drawChart(s.history || []);
    if (s.ready && !news.started) { news.started = true; refreshNews(); }
  } catch (e) {
    const status = $("status");
    status.className = "pill pill-bad";
    status.textContent = "front end unreachable";
  }
}

// Neighbours change while the model trains: refresh the shown word now and then.
function refreshQuery() {
  if (state.query) search(true);
}

// ------------------------------------------------------------------ what is new
// New words (GET /v1/new), rising counts (GET /v1/rising) and the drift of a word against one of the
// front end's checkpoints (GET /v1/drift); asked only once a model is served, so nothing answers 503.
const news = { started: false, history: null, seen: new Set(), driftFollows: true, driftTimer: null };
const WINDOWS = [[60, "1 min"], [300, "5 min"], [900, "15 min"], [3600, "1 h"]];

function chip(word, cls, title) {
  const c = document.createElement("button");
  c.type = "button";
  c.className = "chip " + cls;
  c.textContent = word;
  if (title) c.title = title;
  c.addEventListener("click", () => { $("q").value = word; search(); });
  return c;
}

function wordSpan(word) {
  const w = document.createElement("span");
  w.className = "word";
  w.textContent = word;
  w.title = "show the neighbours of " + word;
  w.addEventListener("click", () => { $("q").value = word; search(); });
  return w;
}

function fillSelect(select, options, preferred) {
  const keep = select.value || preferred;
  select.replaceChildren();
  options.forEach(([value, text]) => {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  });
  const values = options.map(([v]) => String(v));
  select.value = values.includes(String(keep)) ? String(keep) : (values.includes(String(preferred)) ? String(preferred) : values[0] || "");
}

async function refreshHistory() {
  const r = await getJSON("/v1/history");
  if (!r.ok) return;
  const h = news.history = r.body;
  const maxWindow = h.rising.max_window_seconds;
  const windows = WINDOWS.filter(([w]) => w <= maxWindow);
  if (!windows.length) windows.push([maxWindow, fmtAge(maxWindow)]);
  fillSelect($("rising-window"), windows, 300);
  const cps = h.checkpoints.slice().reverse().map((c) => [c.id, `#${c.id} · ${fmtAge(h.now - c.taken_at)} ago`]);
  const options = cps.length ? [["oldest", "oldest"], ...(cps.length > 1 ? [["previous", "previous"]] : []), ...cps] : [];
  fillSelect($("drift-checkpoint"), options, "oldest");
  $("news-note").textContent = `counts sampled every ${fmtAge(h.rising.interval_seconds)} · ` +
    `${h.checkpoints.length} checkpoint${h.checkpoints.length === 1 ? "" : "s"} kept, one every ${fmtAge(h.drift.interval_seconds)}`;
}

async function refreshNew() {
  const r = await getJSON("/v1/new?limit=12");
  const list = $("new-words");
  if (!r.ok) { showEmpty(list, (r.body && r.body.message) || "no answer"); return; }
  const b = r.body;
  if (!b.words.length) {
    showEmpty(list, "no word has arrived since " + fmtAge(b.now - (b.observed_since ?? b.now)) + " ago");
    return;
  }
  list.replaceChildren();
  b.words.forEach((w) => {
    const li = document.createElement("li");
    if (news.seen.size && !news.seen.has(w.word)) li.className = "fresh";
    const age = document.createElement("span");
    age.className = "age";
    age.textContent = fmtAge(b.now - w.first_seen) + " ago";
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = "×" + fmt(w.count);
    li.append(wordSpan(w.word), age, count);
    list.appendChild(li);
  });
  b.words.forEach((w) => news.seen.add(w.word));
  if (b.total > b.words.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = `${fmt(b.total)} words arrived in all`;
    list.appendChild(li);
  }
}

async function refreshRising() {
  const span = $("rising-window").value;
  if (!span) return;
  const by = $("rising-by").value;
  const r = await getJSON(`/v1/rising?window=${encodeURIComponent(span)}&limit=10&by=${by}`);
  const list = $("rising");
  if (!r.ok) { showEmpty(list, (r.body && r.body.message) || "no answer"); return; }
  const b = r.body;
  if (!b.words.length) { showEmpty(list, "no count rose in the last " + fmtAge(b.span_seconds)); return; }
  const value = (w) => (by === "lift" ? w.lift : w.rise);
  const top = Math.max(...b.words.map(value), 1e-9);
  list.replaceChildren();
  b.words.forEach((w) => {
    const li = document.createElement("li");
    li.title = `${w.count_then} → ${w.count} in ${fmtAge(b.span_seconds)}`;
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = Math.max(2, Math.min(100, (value(w) / top) * 100)).toFixed(1) + "%";
    bar.appendChild(fill);
    const rise = document.createElement("span");
    rise.className = "rise";
    rise.textContent = "+" + fmt(w.rise);
    const lift = document.createElement("span");
    lift.className = "lift";
    lift.textContent = "×" + w.lift.toFixed(1);
    li.append(wordSpan(w.word), bar, rise, lift);
    list.appendChild(li);
  });
  if (b.partial) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = `history covers the last ${fmtAge(b.span_seconds)} only`;
    list.appendChild(li);
  }
}

function drawGauge(fraction) {
  const length = 2 * Math.PI * 26;
  const f = fraction === null ? 0 : Math.max(0, Math.min(1, fraction));
  $("drift-arc").setAttribute("stroke-dasharray", `${(f * length).toFixed(1)} ${length.toFixed(1)}`);
  $("drift-pct").textContent = fraction === null ? "–" : Math.round(f * 100) + "%";
}

async function refreshDrift() {
  const word = $("drift-word").value.trim();
  const checkpoint = $("drift-checkpoint").value;
  const boxes = ["drift-entered", "drift-left", "drift-stayed"].map($);
  if (!word || !checkpoint) return;
  const r = await getJSON(`/v1/drift?word=${encodeURIComponent(word)}&k=10&checkpoint=${encodeURIComponent(checkpoint)}`);
  boxes.forEach((b) => b.replaceChildren());
  if (!r.ok) {
    drawGauge(null);
    $("drift-text").textContent = (r.body && r.body.message) || "no answer";
    return;
  }
  const d = r.body;
  drawGauge(d.overlap);
  const cp = d.checkpoint;
  const when = `checkpoint #${cp.id}, ${fmtAge(cp.age_seconds)} ago (v${cp.version})`;
  $("drift-text").textContent = d.in_checkpoint
    ? `of the ${d.now.length} neighbours of “${d.word}” ${d.shared} were already there at ${when}` +
      (d.self_similarity === null ? "" : ` · its vector then and now: cos ${d.self_similarity.toFixed(3)}`)
    : `“${d.word}” arrived after ${when}: every neighbour is new`;
  const then = new Set(d.then.map((n) => n.word));
  d.entered.forEach((n) => boxes[0].appendChild(chip(n.word, "in", "now " + n.score.toFixed(3))));
  d.left.forEach((n) => boxes[1].appendChild(chip(n.word, "out", "then " + n.score.toFixed(3))));
  d.now.filter((n) => then.has(n.word)).forEach((n) => boxes[2].appendChild(chip(n.word, "stay")));
  boxes.forEach((b) => {
    if (!b.children.length) { const none = document.createElement("span"); none.className = "meta"; none.textContent = "none"; b.appendChild(none); }
  });
}

// The drift view follows the searched word until a word is typed into it.
function followDrift(word) {
  if (!news.driftFollows || document.activeElement === $("drift-word")) return;
  $("drift-word").value = word;
  clearTimeout(news.driftTimer);
  news.driftTimer = setTimeout(refreshDrift, 250);
}

async function refreshNews() {
  if (!state.lastStats || !state.lastStats.ready) return;
  try {
    await refreshHistory();
    await Promise.all([refreshNew(), refreshRising(), refreshDrift()]);
  } catch (e) { /* the stats pill already says when the front end is unreachable */ }
}

$("drift-word").addEventListener("input", () => {
  news.driftFollows = !$("drift-word").value.trim();
  clearTimeout(news.driftTimer);
  news.driftTimer = setTimeout(refreshDrift, 300);
});
$("drift-checkpoint").addEventListener("change", refreshDrift);
$("rising-window").addEventListener("change", refreshRising);
$("rising-by").addEventListener("change", refreshRising);
setInterval(refreshNews, 5000);

$("q").addEventListener("input", onType);
$("k").addEventListener("change", () => search(false));
$("analogy-form").addEventListener("submit", analogy);
refreshStats();
setInterval(refreshStats, 1000);
setInterval(refreshQuery, 3000);
