"use strict";
// Everything the page shows comes from the app's own API; text goes in with textContent only,
// so nothing an order or a message carries can become markup.
(() => {
  const REFRESH_MS = 2000;
  const ACTOR_KEY = "sas.actor";
  const HEALTH_EVERY = 5;  // refreshes: the health view reads every order of its window
  // A read that gets no answer is given up (and shown as a problem), so one stuck call cannot
  // stop the page refreshing; an action is waited for, as it may have been done.
  const READ_TIMEOUT_MS = 60000;
  const STATES = [
    "Pending", "Processing", "Compensating", "Processed", "Compensated", "Error", "Closed",
    "Cancelled", "Terminated",
  ];
  const ENDED = ["Processed", "Compensated", "Error", "Closed", "Cancelled", "Terminated"];
  // In Azure every route needs the function key: the page is opened with ?code=<key> and sends
  // it on its own calls. Locally the dev host needs none.
  const key = new URLSearchParams(location.search).get("code");
  const $ = (id) => document.getElementById(id);
  let paused = false;
  let timer = null;
  let refreshes = 0;
  let openOrder = null;
  let alertsWaiting = null;  // from the last health view, for its card
  let healthDue = true;  // read the health view on the next refresh, whatever its count
  let auditDue = true;  // read the audit on the next refresh: an operator acted from this page

  async function call(method, path, body) {
    const headers = { accept: "application/json" };
    if (key) headers["x-functions-key"] = key;
    if (body !== undefined) headers["content-type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store", credentials: "same-origin",
        signal: method === "GET" ? AbortSignal.timeout(READ_TIMEOUT_MS) : undefined,
      });
    } catch (error) {
      if (error.name === "TimeoutError") throw new Error(`no answer in ${READ_TIMEOUT_MS / 1000} s`);
      throw error;
    }
    const payload = response.headers.get("content-type")?.includes("json")
      ? await response.json() : await response.text();
    const total = response.headers.get("x-total-count");
    if (Array.isArray(payload) && total !== null) payload.total = Number(total);
    if (Array.isArray(payload)) payload.more = response.headers.get("x-more-unlisted") === "true";
    if (!response.ok) {
      const detail = typeof payload === "object" && payload !== null ? payload.detail : payload;
      const reason = typeof detail === "string" ? detail : JSON.stringify(detail);
      throw new Error(`${response.status}: ${reason}`);
    }
    return payload;
  }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    return node;
  }

  function row(cells, attrs) {
    const tr = el("tr", null, attrs);
    for (const cell of cells) {
      tr.append(cell instanceof Node ? wrap(cell) : el("td", cell ?? "—"));
    }
    return tr;
  }

  function wrap(node) {
    const td = el("td");
    td.append(node);
    return td;
  }

  // Today's times without the date, so the tables stay narrow.
  // Every time on the page as the CLI shows it: to the second, in UTC, saying so (local
  // time in the tooltip).
  function when(iso) {
    if (!iso) return "—";
    const at = new Date(iso);
    const text = `${at.toISOString().slice(0, 19).replace("T", " ")} UTC`;
    return el("time", text, { datetime: iso, title: at.toLocaleString() });
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    if (seconds < 120) return `${Math.round(seconds)} s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  }

  // A step as the CLI names it too: "charge", or "charge (undo)" while it is being undone.
  function stepLabel(order) {
    return order.mode === "undo" ? `${order.step} (undo)` : order.step;
  }

  function stateBadge(state, mode) {
    // Pending while undoing (an undo step waiting for its retry): said, and coloured as undo.
    const undoing = state === "Pending" && mode === "undo";
    return el("span", undoing ? "Pending (undo)" : state,
      { class: "state", "data-state": state, "data-mode": undoing ? "undo" : null });
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function renderCounts(stats) {
    const cards = STATES.map((state) => {
      const card = el("div", null, { class: "card", "data-state": state, title: `show ${state} orders` });
      card.append(el("span", state, { class: "label" }));
      card.append(el("span", stats.states[state] ?? 0, { class: "count", "data-state-count": state }));
      if ($("filter-state").value === state) card.classList.add("selected");
      card.addEventListener("click", () => {
        const select = $("filter-state");
        select.value = select.value === state ? "" : state;
        offset = 0;
        refresh();
      });
      return card;
    });
    const parked = el("div", null, { class: "card", "data-kind": "parked" });
    parked.append(el("span", "Parked", { class: "label" }));
    const shown = stats.parked_more ? `${stats.parked}+` : stats.parked;
    parked.append(el("span", shown, { class: "count", "data-count": "parked" }));
    cards.push(parked);
    const alerts = el("div", null, { class: "card", "data-kind": "alerts", title: "open alerts" });
    alerts.append(el("span", "Open alerts", { class: "label" }));
    alerts.append(el("span", alertsWaiting ?? "—", { class: "count", "data-count": "alerts" }));
    alerts.addEventListener("click", () => $("health").scrollIntoView());
    cards.push(alerts);
    $("counts").replaceChildren(...cards);
  }

  function ordersQuery() {
    const query = new URLSearchParams();
    const state = $("filter-state").value;
    const priority = $("filter-priority").value;
    const older = $("filter-older").value;
    const newer = $("filter-newer").value;
    if (state) query.set("state", state);
    if (priority) query.set("priority", priority);
    if (older !== "") query.set("older_than_seconds", String(Number(older) * 60));
    if (newer !== "") query.set("newer_than_seconds", String(Number(newer) * 60));
    for (const name of ["workflow", "step", "error"]) {
      const value = $(`filter-${name}`).value.trim();
      if (value) query.set(name, value);
    }
    // The inputs hold UTC wall time, as the page shows every time, 24-hour, seconds optional.
    for (const [name, id] of [["submitted_from", "filter-from"], ["submitted_until", "filter-until"]]) {
      const value = $(id).value.trim().replace(" ", "T");
      if (!value) continue;
      const full = value.length === 10 ? `${value}T00:00:00` : value.length === 16 ? `${value}:00` : value;
      query.set(name, `${full}Z`);
    }
    query.set("limit", $("filter-limit").value || "50");
    return query.toString();
  }

  let offset = 0;  // the first order shown: paging through what the filters match

  function pageQuery() {
    const query = new URLSearchParams(ordersQuery());
    if (offset > 0) query.set("offset", String(offset));
    return query.toString();
  }

  function turnPage(step) {
    const size = Number($("filter-limit").value || "50");
    offset = Math.max(0, offset + step * size);
    refresh();
  }

  // Bulk resubmit: a dry run first (what the filters match among Error orders, whatever the
  // state filter says), then the run, on the same filters, reporting each order.
  let bulkIds = null;  // what the dry run showed: the run acts on these only

  function bulkRequest(dryRun) {
    const query = new URLSearchParams(ordersQuery());
    const request = {
      actor: actorName() ?? "dashboard", dry_run: dryRun, limit: Number(query.get("limit")),
    };
    if (!dryRun) request.order_ids = bulkIds;
    for (const name of ["priority", "workflow", "step", "error"]) {
      if (query.get(name)) request[name] = query.get(name);
    }
    for (const name of ["older_than_seconds", "newer_than_seconds"]) {
      if (query.get(name)) request[name] = Number(query.get(name));
    }
    for (const name of ["submitted_from", "submitted_until"]) {
      if (query.get(name)) request[name] = query.get(name);
    }
    return call("POST", "/api/orders/resubmit", request);
  }

  async function bulkCheck() {
    $("bulk-confirm").hidden = true;
    try {
      const report = await bulkRequest(true);
      bulkIds = report.orders.map((entry) => entry.order_id);
      const more = report.total > report.matched ? ` (of ${report.total} matching)` : "";
      $("bulk-outcome").textContent = report.matched === 0
        ? "no Error order matches"
        : `${report.matched} Error order(s) would be resubmitted${more}: ${bulkIds.join(", ")}`;
      $("bulk-outcome").dataset.matched = String(report.matched);
      $("bulk-confirm").hidden = report.matched === 0;
    } catch (error) {
      $("bulk-outcome").textContent = `not checked: ${error.message}`;
    }
  }

  async function bulkRun() {
    if (actor($("bulk-outcome")) === null) return;
    $("bulk-confirm").hidden = true;
    try {
      const report = await bulkRequest(false);
      const done = report.orders.filter((entry) => entry.outcome === "done").length;
      const refused = report.orders.filter((entry) => entry.outcome !== "done")
        .map((entry) => `${entry.order_id} (${entry.outcome})`);
      const gone = report.not_matched ?? [];
      $("bulk-outcome").textContent = `resubmitted ${done} of ${report.matched}`
        + (refused.length ? `; ${refused.join("; ")}` : "")
        + (gone.length ? `; no longer matched, left alone: ${gone.join(", ")}` : "");
      $("bulk-outcome").dataset.done = String(done);
      auditDue = true;
    } catch (error) {
      $("bulk-outcome").textContent = `not resubmitted: ${error.message}`;
    }
    await refresh();
  }

  function renderOrders(orders) {
    const rows = orders.map((order) => {
      const tr = row(
        [
          el("code", order.order_id), order.workflow, stateBadge(order.process_state, order.mode),
          order.priority,
          stepLabel(order), order.attempt, order.failure_count,
          when(order.submitted_at), when(order.updated_at),
          el("span", order.last_error ?? "", { class: "error" }),
        ],
        { "data-order-id": order.order_id, "data-state": order.process_state },
      );
      if (order.order_id === openOrder) tr.classList.add("selected");
      tr.addEventListener("click", () => openTimeline(order.order_id));
      return tr;
    });
    fill($("orders").tBodies[0], rows);
    $("orders-empty").hidden = orders.length > 0;
    const total = orders.total ?? orders.length;
    if (orders.length === 0 && offset > 0) {  // the matches shrank below the page
      offset = 0;
      refresh();
      return;
    }
    $("orders-shown").textContent = offset === 0
      ? `showing ${orders.length} of ${total}`
      : `showing ${offset + 1}-${offset + orders.length} of ${total}`;
    $("orders-shown").dataset.total = String(total);
    $("page-previous").disabled = offset === 0;
    $("page-next").disabled = offset + orders.length >= total;
  }

  function renderTimeline(order) {
    if (order.order_id !== openOrder) return;  // closed, or another opened, while it loaded
    $("timeline").hidden = false;
    $("timeline").dataset.orderId = order.order_id;
    $("timeline").dataset.state = order.process_state;
    $("timeline-order").textContent = order.order_id;
    const badge = stateBadge(order.process_state, order.mode);
    $("timeline-state").textContent = badge.textContent;
    $("timeline-state").dataset.state = order.process_state;
    if (badge.dataset.mode) $("timeline-state").dataset.mode = badge.dataset.mode;
    else delete $("timeline-state").dataset.mode;
    $("timeline-trace").textContent = order.trace_id || "—";
    $("timeline-workflow").textContent =
      `${order.workflow} v${order.version}, ${order.priority} priority`;
    $("timeline-input").textContent = JSON.stringify(order.details);
    const ended = ENDED.includes(order.process_state);
    $("timeline-step-label").textContent = ended ? "Ended at" : "Now at";
    $("timeline-step").textContent =
      `${stepLabel(order)}, attempt ${order.attempt}, failures ${order.failure_count}`
      + (order.waiting ? ` · waiting: ${order.waiting}` : "")
      + (order.suspended ? " · suspended: nothing new runs until resumed" : "")
      + (order.cancelled && !ended ? ` · being undone: ${order.cancelled}` : "");
    $("timeline").dataset.suspended = String(order.suspended);
    showSteering(order, ended);
    $("timeline-error").textContent = order.last_error || "—";
    // An order waiting for its workflow version may be closed too (never resubmitted).
    $("resubmit-box").hidden = order.process_state !== "Error" && !order.waiting;
    // "resubmitted" stays while the order runs again; back in Error, it is no longer news.
    if (order.process_state === "Error" && $("resubmit-outcome").dataset.outcome === "ok") {
      clearOutcome();
    }
    fill($("steps").tBodies[0], order.steps.map((step) => row(
      [step.index, step.name, step.attempt, when(step.completed_at),
        el("code", JSON.stringify(step.result), { class: "result" })],
      { "data-step": step.name },
    )));
    const undo = order.history.filter((entry) => entry.mode === "undo");
    fill($("compensation").tBodies[0], undo.map((entry) => row(
      [when(entry.at), entry.kind, entry.step, entry.attempt, entry.endpoint, entry.detail],
      { "data-kind": entry.kind },
    )));
    fill($("history").tBodies[0], order.history.map((entry) => row(
      [when(entry.at), entry.kind, entry.step, entry.mode, entry.attempt, entry.endpoint,
        entry.actor, entry.detail],
      { "data-kind": entry.kind, "data-mode": entry.mode },
    )));
  }

  // --- health: throughput, endpoints and their breakers, waiting alerts -------------------
  const SERIES = ["processed", "compensated", "error", "closed"];
  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // One stacked bar per bucket (finished, by state now), a dot for the orders submitted.
  function renderThroughput(report) {
    const width = 600;
    const height = 100;
    const slot = width / Math.max(report.buckets.length, 1);
    const top = Math.max(1, ...report.buckets.map((b) => Math.max(b.submitted,
      SERIES.reduce((sum, name) => sum + b[name], 0))));
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none",
      role: "img", "aria-label": "orders finished and submitted per interval" });
    report.buckets.forEach((bucket, index) => {
      const group = svg("g", { "data-start": bucket.start });
      const label = `${when(bucket.start).textContent}: ${bucket.submitted} submitted, `
        + SERIES.map((name) => `${bucket[name]} ${name}`).join(", ");
      group.append(svg("title", {}, label));
      let y = height;
      for (const name of SERIES) {
        const tall = (bucket[name] / top) * (height - 4);
        if (tall > 0) {
          y -= tall;
          group.append(svg("rect", { x: index * slot + 1, y, width: Math.max(slot - 2, 1),
            height: tall, "data-series": name }));
        }
      }
      if (bucket.submitted > 0) {
        group.append(svg("rect", { x: index * slot + slot / 4,
          y: height - (bucket.submitted / top) * (height - 4) - 1, width: slot / 2, height: 2,
          "data-series": "submitted" }));
      }
      chart.append(group);
    });
    // The scale: the first interval's start, the tallest bar's count, the window's end.
    const buckets = report.buckets;
    const size = buckets.length > 1 ? new Date(buckets[1].start) - new Date(buckets[0].start) : 0;
    const end = buckets.length ? new Date(new Date(buckets[buckets.length - 1].start).getTime() + size) : null;
    const axis = el("div", null, { class: "axis" });
    axis.append(
      buckets.length ? when(buckets[0].start) : el("span", "—"),
      el("span", `tallest bar: ${top} order(s) per ${Math.round(size / 60000)} min`, { class: "scale" }),
      end ? when(end.toISOString()) : el("span", "—"),
    );
    $("throughput").replaceChildren(chart, axis);
  }

  // A breaker whose time is up lets a probe through: "until" a past time would mislead.
  function openUntil(endpoint) {
    if (endpoint.breaker === "closed" || !endpoint.opened_until) return "—";
    if (new Date(endpoint.opened_until) <= new Date()) return "probing now";
    return when(endpoint.opened_until);
  }

  function renderHealth(report) {
    renderThroughput(report);
    const rate = report.failure_rate === null ? "no order finished"
      : `failure rate ${(report.failure_rate * 100).toFixed(1)}%`;
    const submitted = report.buckets.reduce((sum, b) => sum + b.submitted, 0);
    const apart = ["closed", "cancelled", "terminated"].map((kind) => [kind,
      report.buckets.reduce((sum, b) => sum + (b[kind] ?? 0), 0)]).filter(([, n]) => n > 0);
    $("health-summary").textContent = `${submitted} submitted, ${report.finished} finished`
      + apart.map(([kind, n]) => `, ${n} ${kind} by an operator`).join("")
      + `, ${report.failed} failed (${rate}) since ${when(report.since).textContent}`
      + (report.problems.length ? ` · not read: ${report.problems.join("; ")}` : "")
      + (report.waiting || []).map((w) => ` · ${w.orders} order(s) wait: ${w.reason}`).join("")
      + (report.saturated
        ? ` · saturated: ${report.retries_held_back} expired step(s) waited for the retry budget in the last minute`
        : "");
    $("health-summary").dataset.failed = String(report.failed);
    $("health-summary").dataset.saturated = String(Boolean(report.saturated));
    fill($("endpoints").tBodies[0], report.endpoints.map((e) => row(
      [el("code", e.target),
        el("span", e.breaker.replace("_", " "), { class: "breaker", "data-breaker": e.breaker }),
        `${e.failures} of ${e.calls}`, openUntil(e),
        e.capacity === null ? e.in_flight : `${e.in_flight} of ${e.capacity}`, e.processes],
      { "data-target": e.target, "data-breaker": e.breaker },
    )));
    fill($("alerts").tBodies[0], report.open_alerts.map((group) => {
      const orders = el("span");
      for (const alert of group.alerts.slice(0, 5)) {
        orders.append(el("a", shortId(alert.order_id),
          { href: `#order=${encodeURIComponent(alert.order_id)}`, title: alert.order_id }), " ");
      }
      if (group.alerts.length > 5) orders.append(`and ${group.alerts.length - 5} more`);
      const ack = el("button", "Acknowledge", { type: "button", class: "quiet acknowledge" });
      ack.addEventListener("click", () => acknowledge(group.alerts.map((a) => a.alert_id)));
      return row(
        [group.workflow || "—", group.step || "—", el("span", group.reason, { class: "error" }),
          group.count, when(group.last_at), orders, ack],
        { "data-step": group.step, "data-orders": group.alerts.map((a) => a.order_id).join(" ") },
      );
    }));
    alertsWaiting = report.open_alerts.reduce((sum, group) => sum + group.count, 0);
    $("alerts-count").textContent = `(${alertsWaiting})`;
    $("alerts-empty").hidden = report.open_alerts.length > 0;
  }

  async function acknowledge(alertIds) {
    const outcome = $("alerts-outcome");
    const who = actor(outcome);
    if (who === null) return;
    const note = $("ack-note").value.trim();
    try {
      const body = { alert_ids: alertIds, actor: who };
      if (note) body.note = note;
      const report = await call("POST", "/api/alerts/acknowledge", body);
      const done = Object.values(report.outcomes).filter((o) => o === "acknowledged").length;
      outcome.textContent = `acknowledged ${done} of ${alertIds.length}`;
      outcome.dataset.outcome = "acknowledged";
      $("ack-note").value = "";
    } catch (error) {
      outcome.textContent = `not acknowledged: ${error.message}`;
      outcome.dataset.outcome = "refused";
    }
    healthDue = true;
    auditDue = true;
    await refresh();
  }

  function renderAudit(entries) {
    fill($("audit").tBodies[0], entries.map((entry) => row(
      [when(entry.at), entry.actor, entry.action, el("code", shortId(entry.target), { title: entry.target }),
        entry.reason, entry.detail],
      { "data-action": entry.action, "data-target": entry.target },
    )));
    $("audit-empty").hidden = entries.length > 0;
  }

  // One table for both kinds: "app" (bad input the app refused) and "host" (what the
  // Functions host gave up on, in a poison or dead-letter queue).
  function renderParked(parked) {
    fill($("parked").tBodies[0], parked.map((message) => row(
      [el("span", message.parked_by, { class: "by", "data-by": message.parked_by }),
        el("code", shortId(message.id), { class: "id", title: message.id }), message.queue, message.function,
        age(message.age_seconds), message.delivery_count,
        el("span", message.reason, { class: "error" }),
        el("span", message.body_text ?? `(binary) ${message.body_base64}`, { class: "body" }),
        parkedActions(message.id)],
      { "data-parked-id": message.id, "data-by": message.parked_by },
    )));
    const total = `${parked.total ?? parked.length}${parked.more ? "+" : ""}`;
    $("parked-count").textContent = `(${total})`;
    $("parked-shown").textContent = `showing ${parked.length} of ${total}`;
    $("parked-shown").title = parked.more
      ? "a Storage poison queue shows its first 32: settle these, then more appear" : "";
    $("parked-empty").hidden = parked.length > 0;
  }

  // Host-parked ids are long Base64 (60 characters): the start and the end tell them apart;
  // the title, the actions and `sas parked` take the whole id. The app's ids are shown whole.
  function shortId(id) {
    return id.length <= 40 ? id : `${id.slice(0, 12)}…${id.slice(-10)}`;
  }

  function parkedFilters() {
    const filters = {};
    if ($("parked-by").value) filters.parked_by = $("parked-by").value;
    for (const name of ["queue", "reason"]) {
      const value = $(`parked-${name}`).value.trim();
      if (value) filters[name] = value;
    }
    const older = $("parked-older").value;
    if (older !== "") filters.older_than_seconds = Number(older) * 60;
    return filters;
  }

  function parkedQuery() {
    const query = new URLSearchParams({ limit: "20" });
    for (const [name, value] of Object.entries(parkedFilters())) query.set(name, String(value));
    return query.toString();
  }

  // Replay or discard every parked message the filters match: a dry run first, then the run
  // on the ids it showed, reporting each.
  let parkedBulk = null;  // { verb, ids } of the last dry run

  async function parkedBulkCheck(verb) {
    const confirm = $("parked-bulk-confirm");
    const outcome = $("parked-bulk-outcome");
    confirm.hidden = true;
    try {
      const report = await call("POST", `/api/parked/${verb}`,
        { ...parkedFilters(), actor: actorName() ?? "dashboard", dry_run: true, limit: 100 });
      const ids = report.messages.map((m) => m.id);
      parkedBulk = { verb, ids };
      const done = verb === "replay" ? "replayed" : "discarded";
      const more = report.total > report.matched ? ` (of ${report.total} matching)` : "";
      outcome.textContent = report.matched === 0 ? "no parked message matches"
        : `${report.matched} message(s) would be ${done}${more}: ${ids.join(", ")}`;
      outcome.dataset.matched = String(report.matched);
      confirm.textContent = verb === "replay" ? "Replay them" : "Discard them for good";
      confirm.hidden = report.matched === 0;
    } catch (error) {
      outcome.textContent = `not checked: ${error.message}`;
    }
  }

  async function parkedBulkRun() {
    const { verb, ids } = parkedBulk;
    const outcome = $("parked-bulk-outcome");
    const who = actor(outcome);
    if (who === null) return;
    $("parked-bulk-confirm").hidden = true;
    const done = verb === "replay" ? "replayed" : "discarded";
    try {
      const report = await call("POST", `/api/parked/${verb}`,
        { ...parkedFilters(), actor: who, dry_run: false, limit: 100, ids });
      const ok = report.messages.filter((m) => m.outcome === "done").length;
      const refused = report.messages.filter((m) => m.outcome !== "done")
        .map((m) => `${m.id} (${m.outcome})`);
      outcome.textContent = `${done} ${ok} of ${report.matched}`
        + (refused.length ? `; ${refused.join("; ")}` : "")
        + ((report.not_matched ?? []).length
          ? `; no longer matched, left alone: ${report.not_matched.join(", ")}` : "")
        + (report.more_unlisted ? "; more may be parked than were listed: check again" : "");
      outcome.dataset.done = String(ok);
      auditDue = true;
    } catch (error) {
      outcome.textContent = `not ${done}: ${error.message}`;
    }
    await refresh();
  }

  // Replay, or discard (a second click within ARM_MS confirms): the same routes as `sas
  // parked`. Which discards are armed outlives the table's refresh, not ARM_MS.
  const ARM_MS = 10000;
  const armed = new Map();  // parked id -> when its Discard was first clicked

  function isArmed(id) {
    const since = armed.get(id);
    if (since !== undefined && Date.now() - since > ARM_MS) armed.delete(id);
    return armed.has(id);
  }

  function parkedActions(id) {
    const replay = el("button", "Replay", { type: "button", class: "action replay" });
    const discard = el("button", isArmed(id) ? "Discard for good" : "Discard",
      { type: "button", class: "quiet discard", "data-armed": isArmed(id) ? "1" : null });
    replay.addEventListener("click", () => {
      armed.delete(id);
      return parkedAction(id, "replayed", "POST", "/replay");
    });
    discard.addEventListener("click", () => {
      if (isArmed(id)) {
        armed.delete(id);
        return parkedAction(id, "discarded", "DELETE", "");
      }
      armed.set(id, Date.now());
      discard.dataset.armed = "1";
      discard.textContent = "Discard for good";
      return null;
    });
    const cell = el("span", null, { class: "actions" });
    cell.append(replay, discard);
    return cell;
  }

  async function parkedAction(id, done, method, suffix) {
    const outcome = $("parked-outcome");
    const who = actor(outcome);
    if (who === null) return;
    try {
      await call(method, `/api/parked/${encodeURIComponent(id)}${suffix}?actor=${encodeURIComponent(who)}`);
      outcome.textContent = `${done} ${id}`;
      auditDue = true;
      outcome.dataset.outcome = "ok";
    } catch (error) {
      outcome.textContent = `not ${done}: ${error.message}`;
      outcome.dataset.outcome = "refused";
    }
    await refresh();
  }

  async function refresh() {
    const problems = [];
    const attempt = async (what, load, render) => {
      try {
        render(await load());
      } catch (error) {
        problems.push(`${what}: ${error.message}`);
      }
    };
    const audited = auditDue;  // after an action: its alert may have cleared, too
    const health = healthDue || audited || refreshes % HEALTH_EVERY === 0;
    const orders = pageQuery();
    const minutes = $("health-minutes").value;
    const parked = parkedQuery();
    healthDue = false;
    auditDue = false;
    await Promise.all([
      attempt("counts", () => call("GET", "/api/stats"), renderCounts),
      // A page asked for before the filters or the page changed is not shown.
      attempt("orders", () => call("GET", `/api/orders?${orders}`), (found) => {
        if (pageQuery() === orders) renderOrders(found);
      }),
      attempt("parked", () => call("GET", `/api/parked?${parked}`), (found) => {
        if (parkedQuery() === parked) renderParked(found);
      }),
      !health ? null : attempt("health", () => call("GET", `/api/health/report?minutes=${minutes}`),
        (report) => { if ($("health-minutes").value === minutes) renderHealth(report); }),
      !(health || audited) ? null
        : attempt("audit", () => call("GET", "/api/audit?limit=20"), renderAudit),
      openOrder === null ? null : attempt(
        "order", () => call("GET", `/api/orders/${encodeURIComponent(openOrder)}`), renderTimeline,
      ),
    ]);
    $("problem").hidden = problems.length === 0;
    $("problem").textContent = problems.join(" · ");
    refreshes += 1;
    const updated = $("updated-at");
    const now = new Date().toISOString();
    updated.textContent = when(now).textContent;
    updated.dateTime = now;
    updated.dataset.refreshes = String(refreshes);
    $("status").textContent = paused ? "paused" : "live";
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) timer = setTimeout(async () => { await refresh(); schedule(); }, REFRESH_MS);
  }

  function clearOutcome() {
    $("resubmit-outcome").textContent = "";
    delete $("resubmit-outcome").dataset.outcome;
  }

  // The page's address names the open order (#order=<id>): a link to it opens it.
  function linkTo(orderId) {
    const url = new URL(location.href);
    url.hash = orderId === null ? "" : `order=${encodeURIComponent(orderId)}`;
    history.replaceState(null, "", url);
  }

  function linkedOrder() {
    const match = /^#order=(.+)$/.exec(location.hash);
    return match ? decodeURIComponent(match[1]) : null;
  }

  async function openTimeline(orderId) {
    openOrder = orderId;
    linkTo(orderId);
    clearOutcome();
    $("find-outcome").textContent = "";
    for (const tr of $("orders").tBodies[0].rows) {
      tr.classList.toggle("selected", tr.dataset.orderId === orderId);
    }
    try {
      renderTimeline(await call("GET", `/api/orders/${encodeURIComponent(orderId)}`));
      $("timeline").scrollIntoView({ block: "start" });
    } catch (error) {
      closeTimeline();
      $("find-outcome").textContent = `order ${orderId}: ${error.message}`;
    }
  }

  // What an operator may do to the open order, as its state allows (the API decides: 409).
  function showSteering(order, ended) {
    const forward = order.mode === "do" && !order.cancelled;
    const cancellable = forward && (!ended || order.process_state === "Error");
    $("cancel-order").hidden = !cancellable;
    $("suspend-order").hidden = ended || order.suspended;
    $("resume-order").hidden = !order.suspended;
    $("terminate-order").hidden = ended;
    $("steer-reason").hidden = !cancellable && ended;
    $("steer-box").hidden = !cancellable && ended;
  }

  async function steer(verb, done, reasonRequired) {
    const orderId = openOrder;
    const outcome = $("resubmit-outcome");
    const reason = $("steer-reason").value.trim();
    const who = actor(outcome);
    if (who === null) return;
    if (reasonRequired && !reason) {
      outcome.textContent = `not ${done}: say why first`;
      outcome.dataset.outcome = "refused";
      $("steer-reason").focus();
      return;
    }
    const body = { actor: who };
    if (reason) body.reason = reason;
    try {
      const state = await call("POST", `/api/orders/${encodeURIComponent(orderId)}/${verb}`, body);
      outcome.textContent = `${done}: now ${state.process_state}`
        + (state.suspended ? ", suspended" : "");
      outcome.dataset.outcome = verb;
      auditDue = true;
      $("steer-reason").value = "";
    } catch (error) {
      outcome.textContent = `not ${done}: ${error.message}`;
      outcome.dataset.outcome = "refused";
    }
    await refresh();
  }

  function closeTimeline() {
    openOrder = null;
    linkTo(null);
    $("timeline").hidden = true;
  }

  async function closeOrder() {
    const orderId = openOrder;
    const outcome = $("resubmit-outcome");
    const reason = $("close-reason").value.trim();
    const who = actor(outcome);
    if (who === null) return;
    if (!reason) {
      outcome.textContent = "not closed: say how it was settled";
      outcome.dataset.outcome = "refused";
      return;
    }
    try {
      const state = await call(
        "POST", `/api/orders/${encodeURIComponent(orderId)}/close`, { reason, actor: who },
      );
      outcome.textContent = `closed: now ${state.process_state}`;
      auditDue = true;
      outcome.dataset.outcome = "closed";
      $("close-reason").value = "";
    } catch (error) {
      outcome.textContent = `not closed: ${error.message}`;
      outcome.dataset.outcome = "refused";
    }
    await refresh();
  }

  async function resubmit() {
    const orderId = openOrder;
    const button = $("resubmit");
    const outcome = $("resubmit-outcome");
    const who = actor(outcome);
    if (who === null) return;
    button.disabled = true;
    try {
      const state = await call(
        "POST", `/api/orders/${encodeURIComponent(orderId)}/resubmit`, { actor: who },
      );
      outcome.textContent = `resubmitted: now ${state.process_state}`;
      auditDue = true;
      outcome.dataset.outcome = "ok";
    } catch (error) {
      outcome.textContent = `not resubmitted: ${error.message}`;
      outcome.dataset.outcome = "refused";
    } finally {
      button.disabled = false;
    }
    await refresh();
  }

  // Who acts: the signed-in user where App Service sign-in is on (the API takes that name
  // whatever the page sends), else the name typed in "Acting as", kept in this browser.
  let signedIn = null;

  function actorName() {
    return signedIn ?? ($("actor").value.trim() || null);
  }

  function actor(outcome) {
    const name = actorName();
    if (name !== null) {
      if (signedIn === null) localStorage.setItem(ACTOR_KEY, name);
      return name;
    }
    outcome.textContent = "say who is acting first: your name in “Acting as”, at the top";
    outcome.dataset.outcome = "refused";
    $("actor").focus();
    return null;
  }

  async function whoIsSignedIn() {
    try {
      const response = await fetch("/.auth/me", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) return;
      const me = await response.json();
      const name = Array.isArray(me) && me[0] ? me[0].user_id : null;
      if (!name) return;
      signedIn = String(name);
      $("actor-box").hidden = true;
      $("signed-in").textContent = `signed in as ${signedIn}`;
      $("signed-in").hidden = false;
    } catch {
      // no App Service sign-in here: the typed name it is
    }
  }

  function init() {
    $("actor").value = localStorage.getItem(ACTOR_KEY) ?? "";
    whoIsSignedIn();
    const select = $("filter-state");
    for (const state of STATES) select.append(el("option", state));
    if (key) {
      for (const link of document.querySelectorAll("footer a")) {
        link.href = `${link.getAttribute("href")}?code=${encodeURIComponent(key)}`;
      }
    }
    $("filters").addEventListener("change", () => { offset = 0; refresh(); });
    $("page-previous").addEventListener("click", () => turnPage(-1));
    $("page-next").addEventListener("click", () => turnPage(1));
    $("health-minutes").addEventListener("change", () => { healthDue = true; refresh(); });
    $("filters").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
    $("pause").addEventListener("click", () => {
      paused = !paused;
      $("pause").setAttribute("aria-pressed", String(paused));
      $("pause").textContent = paused ? "Resume" : "Pause";
      $("status").textContent = paused ? "paused" : "live";
      if (!paused) refresh();
      schedule();
    });
    $("timeline-close").addEventListener("click", closeTimeline);
    $("find").addEventListener("submit", (event) => {
      event.preventDefault();
      const orderId = $("find-order").value.trim();
      if (orderId) openTimeline(orderId);
    });
    window.addEventListener("hashchange", () => {
      const linked = linkedOrder();
      if (linked !== null && linked !== openOrder) openTimeline(linked);
    });
    $("resubmit").addEventListener("click", resubmit);
    $("close-order").addEventListener("click", closeOrder);
    $("cancel-order").addEventListener("click", () => steer("cancel", "cancelled", true));
    $("suspend-order").addEventListener("click", () => steer("suspend", "suspended", false));
    $("resume-order").addEventListener("click", () => steer("resume", "resumed", false));
    $("terminate-order").addEventListener("click", () => steer("terminate", "terminated", true));
    $("bulk-check").addEventListener("click", bulkCheck);
    $("bulk-confirm").addEventListener("click", bulkRun);
    $("parked-bulk-replay").addEventListener("click", () => parkedBulkCheck("replay"));
    $("parked-bulk-discard").addEventListener("click", () => parkedBulkCheck("discard"));
    $("parked-bulk-confirm").addEventListener("click", parkedBulkRun);
    $("parked-filters").addEventListener("change", () => {
      $("parked-bulk-confirm").hidden = true;
      refresh();
    });
    $("parked-filters").addEventListener("submit", (event) => { event.preventDefault(); refresh(); });
    $("filters").addEventListener("change", () => { $("bulk-confirm").hidden = true; });
    const linked = linkedOrder();
    if (linked !== null) openTimeline(linked);
    refresh().then(schedule);
  }

  init();
})();
