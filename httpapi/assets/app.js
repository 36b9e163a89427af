// The dashboard of fenced serve. The pages are rendered by the server; this
// script keeps them live by polling the JSON API, animates the time-left
// bars between polls, sends breaks, drives the lease trade-off explorer and
// draws the billing scenario's timeline. No framework, no build step.
"use strict";

(() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const SVG = "http://www.w3.org/2000/svg";

  // el builds an element: el("td", {class: "x"}, "text", child...).
  function el(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }
  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG, tag), attrs, children);
  }
  function build(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c !== undefined && c !== null) node.append(c);
    }
    return node;
  }

  // fmtMS formats milliseconds like Go's durations: 950ms, 29.7s, 1m9s.
  function fmtMS(ms) {
    if (!(ms > 0)) return "–";
    if (ms < 1000) return Math.round(ms) + "ms";
    const s = ms / 1000;
    if (s < 60) return (Math.round(s * 10) / 10) + "s";
    const m = Math.floor(s / 60);
    return m + "m" + Math.round(s - 60 * m) + "s";
  }

  // The token lives in this tab only (sessionStorage), never in a cookie:
  // requests carry it as a bearer token, which other sites cannot forge.
  const tokenInput = $("#token");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("fenced-token") || "";
    tokenInput.addEventListener("input", () => sessionStorage.setItem("fenced-token", tokenInput.value.trim()));
  }
  const token = () => (tokenInput ? tokenInput.value.trim() : "");

  async function api(method, path, body, auth) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (auth && token()) headers.Authorization = "Bearer " + token();
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try {
      data = await res.json();
    } catch (e) {
      data = null;
    }
    if (!res.ok) {
      const err = new Error((data && data.message) || res.statusText);
      err.status = res.status;
      err.code = data && data.error;
      throw err;
    }
    return data;
  }

  // ---- Held leases -------------------------------------------------------

  let fetchedAt = performance.now();

  function say(text, kind) {
    const m = $("#message");
    m.textContent = text;
    m.className = kind || "";
  }

  function leaseRow(l) {
    const tr = el("tr", { class: "lease", "data-key": l.key },
      el("td", { class: "key" }, el("a", { href: "/keys/" + encodeURIComponent(l.key) }, l.key)),
      el("td", { class: "fence" }),
      el("td", { class: "holder" }),
      el("td", { class: "left" }, el("progress", { class: "bar", max: 100, value: 0 }), el("span", { class: "left-text" })),
      el("td", { class: "since" }),
      el("td", { class: "actions" }, el("button", { type: "button", class: "break" }, "Break…")));
    return tr;
  }

  function updateRow(tr, l) {
    $(".fence", tr).textContent = l.fence;
    const holder = $(".holder", tr);
    holder.textContent = l.owner_digest ? l.owner_digest.slice(0, 12) + "…" : (l.foreign_holder || "–");
    holder.title = l.owner_digest || l.foreign_holder || "";
    const bar = $(".bar", tr);
    bar.dataset.remaining = l.remaining_ms;
    bar.dataset.ttl = l.ttl_ms || 0;
    $(".since", tr).textContent = stamp(l.held_since);
  }

  // renderLeases updates the table in place: rows that stay are neither
  // rebuilt nor moved, so an open break form keeps its focus and its text.
  function renderLeases(leases) {
    const tbody = $("#lease-rows");
    const keep = new Set(leases.map((l) => l.key));
    for (const tr of [...tbody.children]) {
      if (tr.classList.contains("empty") || !keep.has(tr.dataset.key)) tr.remove();
    }
    const rowOf = (key, cls) => [...tbody.querySelectorAll("tr." + cls)].find((tr) => tr.dataset.key === key);
    let cursor = tbody.firstElementChild;
    for (const l of leases) {
      let tr = rowOf(l.key, "lease");
      if (!tr) {
        tr = leaseRow(l);
        tbody.insertBefore(tr, cursor);
      } else if (tr !== cursor) {
        tbody.insertBefore(tr, cursor);
        const form = rowOf(l.key, "break-form");
        if (form) tr.after(form);
      }
      updateRow(tr, l);
      cursor = tr.nextElementSibling;
      if (cursor && cursor.classList.contains("break-form") && cursor.dataset.key === l.key) cursor = cursor.nextElementSibling;
    }
    if (!leases.length) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 6 }, "No lease is held.")));
    $("#lease-count").textContent = leases.length;
    tickBars();
  }

  // tickBars moves every time-left bar by the time passed since the poll.
  function tickBars() {
    const passed = performance.now() - fetchedAt;
    for (const bar of document.querySelectorAll("progress.bar")) {
      const ttl = +bar.dataset.ttl;
      const left = Math.max(0, +bar.dataset.remaining - passed);
      bar.value = ttl > 0 ? Math.min(100, (100 * left) / ttl) : 0;
      bar.classList.toggle("low", ttl > 0 && left < ttl / 3);
      const text = bar.parentElement.querySelector(".left-text");
      if (text) text.textContent = +bar.dataset.remaining > 0 ? fmtMS(left) : "–";
    }
  }

  async function refreshLeases() {
    try {
      const data = await api("GET", "/api/v1/leases");
      fetchedAt = performance.now();
      renderLeases(data.leases);
      $("#updated").textContent = "updated " + stamp(new Date().toISOString());
      const err = $("#store-error");
      if (err) err.remove();
    } catch (e) {
      $("#updated").textContent = "store not answering: " + e.message;
    }
  }

  function openBreakForm(tr) {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains("break-form")) return;
    const key = tr.dataset.key;
    const form = el("tr", { class: "break-form", "data-key": key },
      el("td", { colspan: 6 },
        "Break ", el("code", {}, key), " (its holder is fenced out) because ",
        el("input", { type: "text", class: "reason", maxlength: 1024, placeholder: "reason, recorded in the audit log" }), " ",
        el("button", { type: "button", class: "danger confirm-break" }, "Break lease"), " ",
        el("button", { type: "button", class: "cancel" }, "Cancel")));
    tr.after(form);
    $(".reason", form).focus();
  }

  async function breakLease(form) {
    const key = form.dataset.key;
    const reason = $(".reason", form).value.trim();
    if (!reason) return say("A reason is required: it is recorded with the break.", "bad");
    if (!token()) return say("Enter an admin token first (top right).", "bad");
    try {
      const r = await api("POST", "/api/v1/leases/" + encodeURIComponent(key) + "/break", { reason }, true);
      form.remove();
      say(`Broke ${key} (fence ${r.broken.fence}) as ${r.by}: its holder is fenced out, the next grant gets a higher fence.`, "good");
      refreshLeases();
    } catch (e) {
      say(`Break refused (${e.status}): ${e.message}`, "bad");
    }
  }

  function initLeases() {
    const tbody = $("#lease-rows");
    tbody.addEventListener("click", (ev) => {
      const b = ev.target.closest("button");
      if (!b) return;
      const tr = b.closest("tr");
      if (b.classList.contains("break")) openBreakForm(tr);
      else if (b.classList.contains("cancel")) tr.remove();
      else if (b.classList.contains("confirm-break")) breakLease(tr);
    });
    tbody.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && ev.target.classList.contains("reason")) breakLease(ev.target.closest("tr"));
    });
    tickBars();
    setInterval(tickBars, 200);
    refreshLeases();
    setInterval(refreshLeases, 1000);
  }

  // ---- Trade-off explorer ------------------------------------------------

  let planSeq = 0;

  async function updatePlan() {
    const ttlMS = +$("#ttl").value;
    const perTTL = +$("#renew").value; // renewals per TTL: 3 is the default, TTL/3
    const renewMS = Math.max(1, Math.round(ttlMS / perTTL));
    const pauseMS = +$("#pause").value;
    $("#ttl-out").textContent = fmtMS(ttlMS);
    $("#renew-out").textContent = fmtMS(renewMS) + " (TTL/" + perTTL + ")";
    $("#pause-out").textContent = pauseMS > 0 ? fmtMS(pauseMS) : "0s";
    const q = new URLSearchParams({ ttl: ttlMS + "ms", renew_every: renewMS + "ms", backend: $("#backend").value });
    if (pauseMS > 0) q.set("max_pause", pauseMS + "ms");
    const seq = ++planSeq;
    try {
      const p = await api("GET", "/api/v1/plan?" + q);
      if (seq === planSeq) showPlan(p);
    } catch (e) {
      if (seq === planSeq) $("#advice").replaceChildren(el("li", { class: "error" }, e.message));
    }
  }

  function showPlan(p) {
    const set = (id, text, cls) => {
      const d = $("#" + id);
      d.textContent = text;
      d.className = cls || "";
    };
    set("freeze-absorbed", fmtMS(p.freeze_absorbed_ms), p.max_pause_ms > 0 ? (p.max_pause_ms <= p.freeze_absorbed_ms ? "good" : "bad") : "");
    set("regrant-after", fmtMS(p.regrant_after_ms));
    if (p.max_pause_ms > 0) set("stale-window", p.stale_window_ms > 0 ? fmtMS(p.stale_window_ms) : "none", p.stale_window_ms > 0 ? "bad" : "good");
    else set("stale-window", "–");
    set("authority-ttl", fmtMS(p.authority_ttl_ms));
    set("recovery", fmtMS(p.recovery_best_ms) + " – " + fmtMS(p.recovery_worst_ms));
    set("traffic", Number(p.renewals_per_second.toPrecision(3)) + "/s");
    set("tolerated", String(p.failed_renewals_tolerated), p.failed_renewals_tolerated === 0 ? "bad" : "");
    $("#advice").replaceChildren(...p.advice.map((a) => el("li", {}, a)));
    drawPlan(p);
  }

  // drawPlan draws one lease around a freeze that starts as a renewal falls
  // due: what the holder trusts, what the authority keeps, and when only the
  // fence protects the resource.
  function drawPlan(p) {
    const chart = $("#plan-chart");
    const left = 150, width = 590;
    const renew = p.renew_every_ms, pause = p.max_pause_ms;
    const tMax = 1.3 * Math.max(p.authority_ttl_ms, renew + pause, p.ttl_ms);
    const x = (t) => left + (Math.min(t, tMax) / tMax) * width;
    const lane = (y, label) => svg("text", { x: 8, y: y + 12, class: "lane" }, label);
    const bar = (t0, t1, y, cls, label) => {
      const g = svg("g", {}, svg("rect", { x: x(t0), y, width: Math.max(0, x(t1) - x(t0)), height: 16, class: cls }));
      if (label) g.append(svg("text", { x: x(t0) + 4, y: y + 12 }, label));
      return g;
    };
    const nodes = [
      svg("defs", {}, svg("pattern", { id: "hatch", patternUnits: "userSpaceOnUse", width: 6, height: 6 },
        svg("rect", { width: 6, height: 6, fill: "#eef0f3" }), svg("path", { d: "M0,6 L6,0", stroke: "#8a93a0" }))),
      lane(14, "holder"),
      svg("line", { x1: x(0), y1: 10, x2: x(0), y2: 32, class: "renewal" }),
      svg("text", { x: x(0) + 3, y: 42 }, "last renewal"),
      svg("line", { x1: x(renew), y1: 10, x2: x(renew), y2: 32, class: "renewal" }),
      lane(54, "holder trusts it"),
      bar(0, p.local_validity_ms, 54, "valid", "local validity " + fmtMS(p.local_validity_ms)),
      lane(88, "authority keeps it"),
      bar(0, p.authority_ttl_ms, 88, "grant", "grant " + fmtMS(p.authority_ttl_ms)),
      bar(p.authority_ttl_ms, tMax, 88, "other", "others may get the key"),
      lane(122, "only the fence"),
    ];
    if (pause > 0) {
      nodes.push(bar(renew, renew + pause, 14, "freeze", "freeze " + fmtMS(pause)));
      if (p.stale_window_ms > 0) nodes.push(bar(p.authority_ttl_ms, renew + pause, 122, "stale", "stale window " + fmtMS(p.stale_window_ms)));
      else nodes.push(svg("text", { x: x(0) + 4, y: 134 }, "no stale window: the freeze ends before anyone else can hold the key"));
    } else {
      nodes.push(svg("text", { x: x(renew) + 4, y: 26 }, "renewal due: the freeze starts here"));
    }
    const absorbed = renew + p.freeze_absorbed_ms;
    nodes.push(svg("line", { x1: x(absorbed), y1: 6, x2: x(absorbed), y2: 150, class: "marker" }),
      svg("text", { x: x(absorbed) - 4, y: 158, "text-anchor": "end" }, "freezes up to here are absorbed"));
    nodes.push(svg("line", { x1: left, y1: 166, x2: left + width, y2: 166, class: "axis" }));
    const step = niceStep(tMax / 8);
    for (let t = 0; t <= tMax; t += step) {
      nodes.push(svg("line", { x1: x(t), y1: 166, x2: x(t), y2: 171, class: "tick" }),
        svg("text", { x: x(t) - 8, y: 184 }, fmtMS(t) === "–" ? "0" : fmtMS(t)));
    }
    chart.replaceChildren(...nodes);
  }

  function niceStep(raw) {
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  function initExplorer() {
    for (const id of ["ttl", "renew", "pause", "backend"]) $("#" + id).addEventListener("input", updatePlan);
    $("#backend").addEventListener("change", updatePlan);
    updatePlan();
  }

  // ---- Scenario timeline -------------------------------------------------

  async function runScenario(fence) {
    const status = $("#scenario-status");
    if (!token()) {
      status.textContent = "Enter a client or admin token first (top right).";
      return;
    }
    const buttons = [$("#run-fenced"), $("#run-unfenced")];
    buttons.forEach((b) => (b.disabled = true));
    status.textContent = `running ${fence ? "with" : "without"} the fence… (a few seconds)`;
    try {
      const r = await api("POST", "/api/v1/scenario", { fence }, true);
      drawTimeline(r);
      status.textContent = `ran ${r.fenced ? "with" : "without"} the fence: ${r.sends.length} invoice(s) sent`;
      const v = $("#verdict");
      v.textContent = r.verdict;
      v.className = r.fenced ? "good" : "bad";
    } catch (e) {
      status.textContent = `refused (${e.status}): ${e.message}`;
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  }

  // drawTimeline draws the scenario's real event stream: one lane per
  // worker, its grant with the fence, the freeze, and each outcome.
  function drawTimeline(r) {
    const chart = $("#timeline");
    const events = r.events;
    const workers = [...new Set(events.filter((e) => e.worker !== "demo").map((e) => e.worker))].sort();
    const t0 = Math.min(...events.map((e) => e.at_ms));
    const t1 = Math.max(...events.map((e) => e.at_ms)) + 150;
    const left = 90, width = 650;
    const x = (t) => left + ((t - t0) / (t1 - t0)) * width;
    const laneY = (w) => 20 + workers.indexOf(w) * 46;
    const nodes = [svg("defs", {}, svg("pattern", { id: "hatch", patternUnits: "userSpaceOnUse", width: 6, height: 6 },
      svg("rect", { width: 6, height: 6, fill: "#eef0f3" }), svg("path", { d: "M0,6 L6,0", stroke: "#8a93a0" })))];
    for (const w of workers) {
      const y = laneY(w);
      const mine = events.filter((e) => e.worker === w);
      nodes.push(svg("text", { x: 8, y: y + 12, class: "lane" }, w));
      const acquired = mine.find((e) => e.kind === "acquired");
      const last = mine[mine.length - 1];
      if (acquired) {
        const barWidth = Math.max(2, x(last.at_ms) - x(acquired.at_ms));
        // A short bar gets its label before it.
        const fenceLabel = barWidth > 60
          ? svg("text", { x: x(acquired.at_ms) + 4, y: y + 12 }, "fence " + acquired.fence)
          : svg("text", { x: x(acquired.at_ms) - 4, y: y + 12, "text-anchor": "end" }, "fence " + acquired.fence);
        nodes.push(svg("g", { class: "grant-bar", "data-worker": w },
          svg("rect", { x: x(acquired.at_ms), y, width: barWidth, height: 16, class: "hold" }), fenceLabel));
      }
      if (w === r.frozen) {
        const freeze = events.find((e) => e.kind === "freeze");
        const resume = events.find((e) => e.kind === "resume");
        if (freeze && resume) {
          nodes.push(svg("g", { class: "freeze-band" },
            svg("rect", { x: x(freeze.at_ms), y: y - 3, width: x(resume.at_ms) - x(freeze.at_ms), height: 22, class: "freeze" }),
            svg("text", { x: x(freeze.at_ms) + 4, y: y + 32 }, "frozen (SIGSTOP)")));
        }
      }
      for (const e of mine) {
        const cx = x(e.at_ms), cy = y + 8;
        // Labels near the right edge end at their mark instead of starting there.
        const label = (text) => cx > left + 0.7 * width
          ? svg("text", { x: cx - 9, y: cy + 22, "text-anchor": "end" }, text)
          : svg("text", { x: cx + 9, y: cy + 16 }, text);
        if (e.kind === "sent") {
          nodes.push(svg("g", { class: "outcome sent-mark" }, svg("circle", { cx, cy, r: 6, class: "sent" }), label("sent, fence " + e.fence)));
        } else if (e.kind === "refused") {
          nodes.push(svg("g", { class: "outcome refused-mark" }, svg("rect", { x: cx - 6, y: cy - 6, width: 12, height: 12, class: "refused" }),
            label("write refused: stale fence " + e.fence)));
        } else if (e.kind === "nothing") {
          nodes.push(svg("g", { class: "outcome" }, svg("circle", { cx, cy, r: 5, class: "nothing" }), label("nothing to do")));
        }
      }
    }
    const axisY = 20 + workers.length * 46;
    nodes.push(svg("line", { x1: left, y1: axisY, x2: left + width, y2: axisY, class: "axis" }));
    const step = niceStep((t1 - t0) / 8);
    for (let t = 0; t0 + t <= t1; t += step) {
      nodes.push(svg("line", { x1: x(t0 + t), y1: axisY, x2: x(t0 + t), y2: axisY + 5, class: "tick" }),
        svg("text", { x: x(t0 + t) - 8, y: axisY + 18 }, fmtMS(t) === "–" ? "0" : fmtMS(t)));
    }
    chart.setAttribute("viewBox", `0 0 760 ${axisY + 26}`);
    chart.replaceChildren(...nodes);
  }

  function initScenario() {
    const a = $("#run-fenced"), b = $("#run-unfenced");
    if (!a) return;
    a.addEventListener("click", () => runScenario(true));
    b.addEventListener("click", () => runScenario(false));
  }

  // ---- One key -----------------------------------------------------------

  // stamp formats a time as the server's pages do (stampLayout in
  // dashboard.go), in UTC: one format on every page, whatever the
  // browser's locale.
  function stamp(s) {
    return s ? new Date(s).toISOString().slice(0, 19).replace("T", " ") + " UTC" : "–";
  }

  async function refreshKey(key) {
    let v;
    try {
      v = await api("GET", "/api/v1/leases/" + encodeURIComponent(key));
    } catch (e) {
      return;
    }
    $("#state").textContent = v.held ? "held" : "free";
    $("#fence").textContent = v.fence;
    $("#holder").textContent = v.owner_digest || v.foreign_holder || "–";
    $("#left").textContent = fmtMS(v.remaining_ms);
    $("#since").textContent = v.held_since ? stamp(v.held_since) : "–";
    const hist = $("#history-rows");
    if (hist && v.history.length) {
      hist.replaceChildren(...v.history.map((h) => el("tr", {},
        el("td", {}, String(h.fence)),
        el("td", { title: h.owner_digest || "" }, h.owner_digest ? h.owner_digest.slice(0, 12) + "…" : (h.foreign_holder || "–"), h.via_api ? el("span", { class: "pill" }, "api") : null),
        el("td", {}, stamp(h.first_seen)), el("td", {}, stamp(h.last_seen)), el("td", {}, h.ended ? stamp(h.ended) : "–"),
        el("td", {}, fmtMS(h.ttl_ms)))));
    }
    const breaks = $("#break-rows");
    if (breaks && v.breaks.length) {
      breaks.replaceChildren(...v.breaks.map((b) => el("tr", {},
        el("td", {}, stamp(b.time)), el("td", {}, String(b.fence)), el("td", {}, b.by), el("td", {}, b.reason))));
    }
  }

  const page = document.body.dataset.page;
  if (page === "index") {
    initLeases();
    initExplorer();
    initScenario();
  } else if (page === "key" && $("#state")) {
    const key = document.body.dataset.key;
    setInterval(() => refreshKey(key), 1000);
  }
})();
