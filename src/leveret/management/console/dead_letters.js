// The dead-letter pages: which queues hold dead letters and why, browsing one without
// side effects, and retry / move / copy / delete on a selection or a filter, as jobs.
import { api, attempt, bars, flash, fmt, h, q, table, when } from "/console/lib.js";

const FILTERS = [
  ["reason", "reason", { placeholder: "rejected, expired, maxlen, delivery_limit" }],
  ["source_queue", "source queue"],
  ["header", "header name:value"],
  ["min_age", "older than (s)", { type: "number", min: 0 }],
  ["max_age", "younger than (s)", { type: "number", min: 0 }],
  ["body", "body contains"],
];
const tags = (counts) => Object.entries(counts || {}).map(([k, n]) => h("span", { class: "tag" }, `${k}: ${fmt(n)}`));
const base = (vhost, queue) => `/api/leveret/dead-letters/${q(vhost)}/${q(queue)}`;

// Points per reason of a timeline ({bucket, points: [{time, count, by_reason}]}).
function timelineSeries(timeline) {
  const reasons = [...new Set(timeline.points.flatMap((p) => Object.keys(p.by_reason)))];
  return reasons.map((reason) => ({ name: reason, points: timeline.points.map((p) => [p.time * 1000, p.by_reason[reason] || 0]) }));
}

export async function list() {
  const queues = await api("GET", "/api/leveret/dead-letters");
  const charts = await Promise.all(
    queues.slice(0, 6).map(async (dlq) => {
      const timeline = await api("GET", `${base(dlq.vhost, dlq.name)}/timeline?bucket=60`).catch(() => null);
      return timeline ? bars(`${dlq.name}: dead letters a minute, by reason`, timelineSeries(timeline)) : null;
    }),
  );
  return h("section", {},
    h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "Queues that receive dead letters (from dead-letter exchanges, policies and ActiveMQ strategies), counted by why and where their messages died."),
    table([
      ["vhost", (d) => d.vhost],
      ["queue", (d) => h("a", { href: `#/dead-letters/${q(d.vhost)}/${q(d.name)}` }, d.name)],
      ["messages", (d) => fmt(d.messages), { num: true }],
      ["by reason", (d) => tags(d.by_reason)],
      ["by source queue", (d) => tags(d.by_source)],
      ["oldest", (d) => when(d.oldest_death)],
      ["newest", (d) => when(d.newest_death)],
    ], queues, { id: "dlq-list" }),
    h("div", { class: "grid2" }, charts),
  );
}
list.refreshEvery = 10000;

// The filter as the API's query and JSON forms.
function readFilter(formElement) {
  const values = Object.fromEntries(new FormData(formElement).entries());
  const filter = {};
  for (const [name] of FILTERS) {
    const value = (values[name] || "").trim();
    if (!value) continue;
    if (name === "header") filter.header = [value];
    else filter[name] = name.endsWith("_age") ? Number(value) : value;
  }
  return filter;
}

function queryOf(filter) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(filter)) (Array.isArray(v) ? v : [v]).forEach((x) => params.append(k, x));
  return params.toString();
}

export async function browse(vhost, queue) {
  const state = { page: 1, filter: {}, selected: new Set() };
  const count = h("b", { id: "dlq-count" }, "");
  const rows = h("div", { id: "dlq-messages" });
  const pager = h("div", { class: "pager" });
  const preview = h("span", { id: "preview-result", class: "muted" });
  const jobStatus = h("div", { id: "job-status" });
  const chartBox = h("div", {});

  const filterForm = h("form", { class: "inline", id: "filter-form" },
    FILTERS.map(([name, text, attrs]) => h("label", {}, text, h("input", { name, ...(attrs || {}) }))),
    h("button", { type: "submit" }, "Filter"),
    h("button", { type: "reset" }, "Clear"),
  );
  filterForm.addEventListener("submit", (event) => {
    event.preventDefault();
    state.filter = readFilter(filterForm);
    state.page = 1;
    state.selected.clear();
    load();
  });
  filterForm.addEventListener("reset", () => setTimeout(() => filterForm.requestSubmit(), 0));

  const scope = h("select", { id: "action-scope" }, h("option", { value: "selected" }, "the selected messages"), h("option", { value: "filter" }, "every message the filter matches"));
  const target = h("input", { id: "action-target", placeholder: "queue, or exchange:routing key" });
  const selection = () => (scope.value === "selected" ? { seqs: [...state.selected] } : { filter: state.filter });

  async function load() {
    const [info, page] = await Promise.all([
      api("GET", `/api/queues/${q(vhost)}/${q(queue)}`),
      api("GET", `${base(vhost, queue)}/messages?page=${state.page}&page_size=50&${queryOf(state.filter)}`),
    ]);
    count.textContent = fmt(info.messages_ready);
    const box = (item) => {
      const input = h("input", { type: "checkbox", class: "pick", dataset: { seq: item.seq } });
      input.checked = state.selected.has(item.seq);
      input.addEventListener("change", () => (input.checked ? state.selected.add(item.seq) : state.selected.delete(item.seq)));
      return input;
    };
    const age = (item) => (item.death && item.death.time ? `${fmt((Date.now() / 1000 - item.death.time) / 60)} min` : "");
    const detail = (item) => h("details", {},
      h("summary", {}, item.body.kind === "hex" ? `${item.payload_bytes} bytes (binary)` : item.body.text.slice(0, 80)),
      h("h4", {}, `body (${item.body.kind})`), h("pre", { class: "body" }, item.body.text),
      h("h4", {}, "death history (x-death)"), h("pre", {}, JSON.stringify(item.deaths, null, 2)),
      h("h4", {}, "properties"), h("pre", {}, JSON.stringify(item.properties, null, 2)),
    );
    rows.replaceChildren(table([
      ["", box],
      ["#", (m) => m.position, { num: true }],
      ["reason", (m) => (m.death ? m.death.reason : "")],
      ["died in", (m) => (m.death ? m.death.queue : "")],
      ["age", age],
      ["routing key", (m) => m.routing_key],
      ["message", detail],
    ], page.items, { id: "dlq-table" }));
    pager.replaceChildren(
      h("button", { disabled: state.page === 1, onclick: () => { state.page--; load(); } }, "‹ previous"),
      h("span", {}, `page ${state.page}`),
      h("button", { disabled: !page.more, onclick: () => { state.page++; load(); } }, "next ›"),
      h("button", { onclick: () => { rows.querySelectorAll("input.pick").forEach((i) => { i.checked = true; state.selected.add(Number(i.dataset.seq)); }); } }, "select page"),
    );
    const timeline = await api("GET", `${base(vhost, queue)}/timeline?bucket=60`).catch(() => null);
    chartBox.replaceChildren(timeline ? bars("Dead letters a minute, by reason", timelineSeries(timeline)) : "");
  }

  async function follow(job) {
    const bar = h("progress", { max: Math.max(job.matched, 1), value: 0 });
    const text = h("span", {});
    jobStatus.replaceChildren(h("div", {}, `Job ${job.id}: ${job.action} `, bar, " ", text));
    while (true) {
      bar.value = job.done + job.failed;
      text.textContent = `${job.state}: ${fmt(job.done)} done, ${fmt(job.failed)} failed of ${fmt(job.matched)}${job.error ? ` (last error: ${job.error})` : ""}`;
      if (job.state !== "running") break;
      await new Promise((resolve) => setTimeout(resolve, 300));
      job = await api("GET", `/api/leveret/jobs/${q(job.id)}`);
    }
    jobStatus.firstChild.classList.add(job.state === "done" && !job.failed ? "ok" : "error");
    state.selected.clear();
    await load();
  }

  async function act(action) {
    const body = { action, ...selection() };
    if (action === "move" || action === "copy") {
      const where = target.value.trim();
      if (!where) return flash("Name the target queue (or exchange:routing key).", true);
      body.target = where.includes(":") ? { exchange: where.split(":")[0], routing_key: where.split(":").slice(1).join(":") } : { queue: where };
    }
    if (scope.value === "selected" && !state.selected.size) return flash("Select messages first, or act on the filter.", true);
    const matching = await attempt(() => api("POST", `${base(vhost, queue)}/preview`, selection()));
    if (!matching) return;
    if (!confirm(`${action} ${matching.matching} message(s)${matching.complete ? "" : " or more"}?`)) return;
    const job = await attempt(() => api("POST", `${base(vhost, queue)}/actions`, body));
    if (job) await follow(job);
  }

  const previewButton = h("button", { id: "preview", onclick: async () => {
    const answer = await attempt(() => api("POST", `${base(vhost, queue)}/preview`, selection()));
    if (answer) preview.textContent = `${fmt(answer.matching)} message(s)${answer.complete ? "" : " at least"}`;
  } }, "How many?");

  const section = h("section", {},
    h("h1", {}, `Dead letters in ${queue} (${vhost}): `, count, " waiting"),
    chartBox,
    h("h2", {}, "Filter"),
    filterForm,
    h("h2", {}, "Act"),
    h("div", { class: "toolbar" },
      h("label", {}, "on", scope),
      previewButton,
      preview,
      h("button", { id: "action-retry", onclick: () => act("retry") }, "Retry to origin"),
      h("label", {}, "target", target),
      h("button", { id: "action-move", onclick: () => act("move") }, "Move"),
      h("button", { id: "action-copy", onclick: () => act("copy") }, "Copy"),
      h("button", { id: "action-delete", class: "danger", onclick: () => act("delete") }, "Delete"),
    ),
    jobStatus,
    h("h2", {}, "Messages (left in place: no redelivery, no reordering)"),
    pager,
    rows,
  );
  await load();
  return section;
}
