// The console's pages over the RabbitMQ-shaped API: each returns the element to show.
import { api, attempt, chart, flash, fmt, form, h, q, ratePoints, samplePoints, session, table, when } from "/console/lib.js";

const SAMPLES = "lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5";
const link = (href, text) => h("a", { href }, text);
const queueLink = (vhost, name) => link(`#/queues/${q(vhost)}/${q(name)}`, name);
const card = (label, value, id) => h("div", { class: "card", id }, h("b", {}, fmt(value)), h("span", {}, label));
const isAdmin = () => session.tags.includes("administrator");

// -- overview --------------------------------------------------------------------------
export async function overview() {
  const o = await api("GET", `/api/overview?${SAMPLES}`);
  const totals = o.queue_totals || {}, objects = o.object_totals || {}, stats = o.message_stats || {};
  const rate = (name) => (stats[`${name}_details`] ? stats[`${name}_details`].rate : 0);
  return h(
    "section",
    { id: "overview" },
    h("h1", {}, "Overview"),
    h("div", { class: "cards" },
      card("messages", totals.messages, "total-messages"),
      card("ready", totals.messages_ready, "total-ready"),
      card("unacknowledged", totals.messages_unacknowledged, "total-unacked"),
      card("publish / s", rate("publish"), "rate-publish"),
      card("deliver / s", rate("deliver_get"), "rate-deliver"),
      card("ack / s", rate("ack"), "rate-ack"),
    ),
    h("div", { class: "grid2" },
      chart("Queued messages", [
        { name: "ready", points: samplePoints(totals.messages_ready_details) },
        { name: "unacknowledged", points: samplePoints(totals.messages_unacknowledged_details) },
      ]),
      chart("Message rates", [
        { name: "publish", points: ratePoints(stats.publish_details) },
        { name: "deliver", points: ratePoints(stats.deliver_get_details) },
        { name: "ack", points: ratePoints(stats.ack_details) },
      ], "/s"),
    ),
    h("h2", {}, "Totals"),
    h("div", { class: "cards" }, ["connections", "channels", "exchanges", "queues", "consumers"].map((k) => card(k, objects[k], `total-${k}`))),
    h("h2", {}, "Listeners"),
    table([["protocol", (l) => l.protocol], ["address", (l) => l.ip_address], ["port", (l) => l.port, { num: true }]], o.listeners || []),
    h("p", { class: "muted" }, `${o.product_name} ${o.product_version} on ${o.node}; RabbitMQ API ${o.rabbitmq_version}`),
  );
}
overview.refreshEvery = 5000;

// -- connections and channels -----------------------------------------------------------
// An MQTT connection's client id; an AMQP client's connection_name.
const clientOf = (c) => (c.client_properties || {}).client_id || (c.client_properties || {}).connection_name || "";

// An MQTT session: clean (ends with the connection) or persistent (its expiry).
function sessionOf(c) {
  const p = c.client_properties || {};
  if (!String(c.protocol || "").startsWith("MQTT")) return "";
  if (p.clean_session) return "clean";
  const expiry = p.session_expiry_interval;
  return expiry >= 4294967295 ? "persistent" : `persistent (expiry ${expiry} s)`;
}

export async function connections() {
  const rows = await api("GET", "/api/connections");
  return h("section", {},
    h("h1", {}, "Connections"),
    table([
      ["name", (c) => link(`#/connections/${q(c.name)}`, c.name)],
      ["user", (c) => c.user],
      ["vhost", (c) => c.vhost],
      ["protocol", (c) => c.protocol],
      ["client", (c) => clientOf(c)],
      ["heartbeat / keep alive", (c) => c.timeout ? `${c.timeout} s` : "", { num: true }],
      ["session", (c) => sessionOf(c)],
      ["channels", (c) => c.channels, { num: true }],
      ["connected", (c) => when(c.connected_at / 1000)],
      ["", (c) => h("button", { class: "danger", onclick: async () => {
        if (await attempt(() => api("DELETE", `/api/connections/${q(c.name)}`), `Closed ${c.name}`) !== undefined) location.hash = "#/connections";
      } }, "Close")],
    ], rows),
  );
}
connections.refreshEvery = 5000;

// An AMQP 1.0 connection has sessions and links (RabbitMQ 4's "AMQP 1-0"; leveret says "AMQP 1.0").
const isAmqp10 = (c) => /AMQP 1[.-]0$/.test(String(c.protocol || ""));
// A window or credit of 0 stops the other side: marked as RabbitMQ 4's page marks it.
const stopped = (n) => h("span", { class: n === 0 ? "stopped" : null }, fmt(n));

function sessionTables(s) {
  const incoming = s.incoming_links || [], outgoing = s.outgoing_links || [];
  const filters = (l) => (l.filter || []).map((f) => h("span", { class: "tag", title: `${f.descriptor}: ${JSON.stringify(f.value)}` }, f.name));
  return h("div", { class: "amqp-session", dataset: { channel: s.channel_number } },
    h("h2", {}, `Session on channel ${s.channel_number}`),
    table([
      ["channel", (x) => x.channel_number, { num: true }],
      ["handle-max", (x) => fmt(x.handle_max), { num: true }],
      ["next-incoming-id", (x) => fmt(x.next_incoming_id), { num: true }],
      ["incoming-window", (x) => stopped(x.incoming_window), { num: true }],
      ["next-outgoing-id", (x) => fmt(x.next_outgoing_id), { num: true }],
      ["remote-incoming-window", (x) => stopped(x.remote_incoming_window), { num: true }],
      ["remote-outgoing-window", (x) => fmt(x.remote_outgoing_window), { num: true }],
      ["outgoing unsettled deliveries", (x) => x.outgoing_unsettled_deliveries, { num: true }],
    ], [s], { class: "session-windows" }),
    h("h3", {}, `Incoming links (${incoming.length})`),
    table([
      ["handle", (l) => l.handle, { num: true }],
      ["link name", (l) => l.link_name],
      ["target address", (l) => l.target_address ?? "(null: each message's to)"],
      ["snd-settle-mode", (l) => l.snd_settle_mode],
      ["max-message-size (bytes)", (l) => fmt(l.max_message_size), { num: true }],
      ["delivery-count", (l) => fmt(l.delivery_count), { num: true }],
      ["link-credit", (l) => stopped(l.credit), { num: true }],
      ["unconfirmed", (l) => l.unconfirmed_messages, { num: true }],
    ], incoming, { class: "incoming-links" }),
    h("h3", {}, `Outgoing links (${outgoing.length})`),
    table([
      ["handle", (l) => l.handle, { num: true }],
      ["link name", (l) => l.link_name],
      ["source address", (l) => l.source_address],
      ["queue", (l) => l.queue_name],
      ["sender settles", (l) => (l.send_settled ? "yes" : "no")],
      ["max-message-size (bytes)", (l) => fmt(l.max_message_size), { num: true }],
      ["delivery-count", (l) => fmt(l.delivery_count), { num: true }],
      ["link-credit", (l) => stopped(l.credit), { num: true }],
      ["filters", (l) => filters(l)],
    ], outgoing, { class: "outgoing-links" }),
  );
}

// One connection: its facts, then its sessions and links (AMQP 1.0) or its channels.
export async function connection(name) {
  const c = await api("GET", `/api/connections/${q(name)}`);
  const facts = [
    ["user", c.user], ["vhost", c.vhost], ["protocol", c.protocol], ["SASL mechanism", c.auth_mechanism],
    ["client", clientOf(c) || (c.client_properties || {}).container_id || ""], ["heartbeat / keep alive", c.timeout ? `${c.timeout} s` : ""],
    ["frame max (bytes)", fmt(c.frame_max)], ["channel max", c.channel_max], ["TLS", c.ssl ? "yes" : "no"], ["state", c.state], ["connected", when(c.connected_at / 1000)],
  ];
  let detail;
  if (isAmqp10(c)) {
    const sessions = await api("GET", `/api/connections/${q(name)}/sessions`);
    detail = [h("h2", { id: "sessions-title" }, `Sessions (${sessions.length})`), sessions.length ? sessions.map(sessionTables) : h("p", { class: "muted" }, "No sessions.")];
  } else {
    const channels = await api("GET", `/api/connections/${q(name)}/channels`);
    detail = [h("h2", {}, `Channels (${channels.length})`), table([
      ["number", (x) => x.number, { num: true }], ["prefetch", (x) => x.prefetch_count, { num: true }],
      ["unacked", (x) => x.messages_unacknowledged, { num: true }], ["consumers", (x) => x.consumer_count, { num: true }],
    ], channels)];
  }
  return h("section", { id: "connection" },
    h("h1", {}, `Connection ${name}`),
    table([["", (f) => f[0]], ["", (f) => f[1]]], facts, { class: "facts" }),
    ...detail,
  );
}
connection.refreshEvery = 5000;

export async function channels() {
  const rows = await api("GET", "/api/channels");
  return h("section", {},
    h("h1", {}, "Channels"),
    table([
      ["name", (c) => c.name],
      ["user", (c) => c.user],
      ["vhost", (c) => c.vhost],
      ["prefetch", (c) => c.prefetch_count, { num: true }],
      ["confirm", (c) => (c.confirm ? "yes" : "")],
      ["unacked", (c) => c.messages_unacknowledged, { num: true }],
      ["consumers", (c) => c.consumer_count, { num: true }],
    ], rows),
  );
}
channels.refreshEvery = 5000;

// -- exchanges ---------------------------------------------------------------------------
export async function exchanges() {
  const rows = await api("GET", "/api/exchanges");
  const name = (e) => e.name || "amq.default";
  return h("section", {},
    h("h1", {}, "Exchanges"),
    table([
      ["vhost", (e) => e.vhost],
      ["name", (e) => link(`#/exchanges/${q(e.vhost)}/${q(name(e))}`, name(e))],
      ["type", (e) => e.type],
      ["durable", (e) => (e.durable ? "yes" : "")],
    ], rows),
    isAdmin() || session.tags.includes("management") || session.tags.includes("policymaker")
      ? [h("h2", {}, "Add an exchange"), form([["vhost", "vhost", { value: "/" }], ["name", "name", { required: true }], ["type", "type", { options: await exchangeTypes() }]], "Add", async (v) => {
          if (await attempt(() => api("PUT", `/api/exchanges/${q(v.vhost)}/${q(v.name)}`, { type: v.type, durable: true }), `Exchange ${v.name} added`) !== undefined) location.reload();
        })]
      : null,
  );
}

// The types the broker has, as /api/overview lists them (plugin types included).
async function exchangeTypes() {
  const fallback = ["direct", "fanout", "topic", "headers"];
  try {
    const types = (await api("GET", "/api/overview")).exchange_types;
    return types && types.length ? types.map((t) => t.name) : fallback;
  } catch {
    return fallback;
  }
}

function publishForm(vhost, exchange, defaultKey = "") {
  return form(
    [["routing_key", "routing key", { value: defaultKey }], ["payload", "payload", { textarea: true }], ["delivery_mode", "delivery mode", { options: ["2", "1"] }]],
    "Publish",
    async (v, element) => {
      const answer = await attempt(() => api("POST", `/api/exchanges/${q(vhost)}/${q(exchange)}/publish`, {
        routing_key: v.routing_key, payload: v.payload, payload_encoding: "string", properties: { delivery_mode: Number(v.delivery_mode) },
      }));
      if (answer) flash(answer.routed ? "Message published." : "Message published but not routed.", !answer.routed);
      element.reset();
    },
    { id: "publish-form" },
  );
}

export async function exchange(vhost, name) {
  const e = await api("GET", `/api/exchanges/${q(vhost)}/${q(name)}`);
  const bindings = await api("GET", `/api/exchanges/${q(vhost)}/${q(name)}/bindings/source`);
  return h("section", {},
    h("h1", {}, `Exchange ${name} (${vhost})`),
    h("p", {}, `type ${e.type}, ${e.durable ? "durable" : "transient"}`),
    h("h2", {}, "Bindings from here"),
    table([["to", (b) => (b.destination_type === "queue" ? queueLink(vhost, b.destination) : b.destination)], ["routing key", (b) => b.routing_key]], bindings),
    h("h2", {}, "Publish a message"),
    publishForm(vhost, name),
  );
}

// -- queues ------------------------------------------------------------------------------
let queuesPage = 1; // the queues page shown (kept across the 5 s refreshes)
// The filter and order of the queue list, applied by the server (`name`, `sort`,
// `sort_reverse`): with 100,000 queues only the page shown travels and is built.
const queuesView = { name: "", sort: "", reverse: false };
const QUEUE_SORTS = [["", "vhost, name"], ["name", "name"], ["messages", "total"], ["messages_ready", "ready"], ["messages_unacknowledged", "unacked"], ["consumers", "consumers"], ["node", "node"]];
const rerender = () => window.dispatchEvent(new HashChangeEvent("hashchange"));

function queuesQuery(page) {
  const query = new URLSearchParams({ page: String(page), page_size: "100" });
  if (queuesView.name) query.set("name", queuesView.name);
  if (queuesView.sort) query.set("sort", queuesView.sort);
  if (queuesView.reverse) query.set("sort_reverse", "true");
  return `/api/queues?${query}`;
}

function queuesControls() {
  const name = h("input", { id: "queues-filter", placeholder: "filter by name", value: queuesView.name });
  const sort = h("select", { id: "queues-sort" }, ...QUEUE_SORTS.map(([value, label]) => h("option", { value, selected: value === queuesView.sort }, label)));
  const reverse = h("input", { id: "queues-reverse", type: "checkbox", checked: queuesView.reverse });
  const apply = (event) => {
    event.preventDefault();
    Object.assign(queuesView, { name: name.value.trim(), sort: sort.value, reverse: reverse.checked });
    queuesPage = 1;
    rerender();
  };
  return h("form", { class: "inline", id: "queues-view", onsubmit: apply }, name, " sort by ", sort, h("label", {}, reverse, " descending"), h("button", { type: "submit" }, "Show"));
}

export async function queues() {
  let answer = await api("GET", queuesQuery(queuesPage));
  if (queuesPage > 1 && !answer.items.length) {
    queuesPage = 1;
    answer = await api("GET", queuesQuery(1));
  }
  const page = answer.page || 1, pages = answer.page_count || 1;
  const stat = (row, name) => (row.message_stats && row.message_stats[`${name}_details`] ? row.message_stats[`${name}_details`].rate : 0);
  return h("section", {},
    h("h1", {}, `Queues (${answer.total_count})`),
    queuesControls(),
    answer.filtered_count !== answer.total_count ? h("p", { class: "muted", id: "queues-matching" }, `${answer.filtered_count} matching`) : null,
    table([
      ["vhost", (r) => r.vhost],
      ["name", (r) => queueLink(r.vhost, r.name)],
      ["type", (r) => r.type],
      ["node", (r) => r.node],
      ["ready", (r) => fmt(r.messages_ready), { num: true }],
      ["unacked", (r) => fmt(r.messages_unacknowledged), { num: true }],
      ["total", (r) => fmt(r.messages), { num: true }],
      ["consumers", (r) => r.consumers, { num: true }],
      ["publish/s", (r) => fmt(stat(r, "publish")), { num: true }],
      ["deliver/s", (r) => fmt(stat(r, "deliver_get")), { num: true }],
    ], answer.items, { id: "queues-table" }),
    pages > 1
      ? h("div", { class: "pager" },
          h("button", { disabled: page <= 1, onclick: () => { queuesPage = page - 1; rerender(); } }, "‹ previous"),
          h("span", {}, `page ${page} of ${pages}`),
          h("button", { disabled: page >= pages, onclick: () => { queuesPage = page + 1; rerender(); } }, "next ›"))
      : null,
    h("h2", {}, "Add a queue"),
    form([["vhost", "vhost", { value: "/" }], ["name", "name", { required: true }], ["type", "type", { options: ["classic", "quorum", "stream"] }]], "Add", async (v) => {
      const body = { durable: true, arguments: { "x-queue-type": v.type } };
      if (await attempt(() => api("PUT", `/api/queues/${q(v.vhost)}/${q(v.name)}`, body), `Queue ${v.name} added`) !== undefined) location.hash = `#/queues/${q(v.vhost)}/${q(v.name)}`;
    }, { id: "add-queue" }),
  );
}
queues.refreshEvery = 5000;

export async function queue(vhost, name) {
  const path = `/api/queues/${q(vhost)}/${q(name)}`;
  const [info, bindings] = await Promise.all([api("GET", `${path}?${SAMPLES}`), api("GET", `${path}/bindings`)]);
  const got = h("div", { id: "got" });
  const getForm = form([["count", "messages", { value: "1", type: "number", min: 1 }], ["ackmode", "ack mode", { options: ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"] }]], "Get messages", async (v) => {
    const items = await attempt(() => api("POST", `${path}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: "auto", truncate: 50000 }));
    if (!items) return;
    got.replaceChildren(items.length ? table([["#", (m) => items.indexOf(m) + 1], ["routing key", (m) => m.routing_key], ["redelivered", (m) => (m.redelivered ? "yes" : "")], ["payload", (m) => h("pre", {}, m.payload)]], items) : h("p", { class: "muted" }, "The queue is empty."));
  }, { id: "get-form" });
  const bindForm = form([["source", "from exchange", { required: true }], ["routing_key", "routing key"]], "Bind", async (v) => {
    if (await attempt(() => api("POST", `/api/bindings/${q(vhost)}/e/${q(v.source)}/q/${q(name)}`, { routing_key: v.routing_key, arguments: {} }), "Bound") !== undefined) location.reload();
  });
  return h("section", {},
    h("h1", {}, `Queue ${name} (${vhost})`),
    h("div", { class: "cards" },
      card("ready", info.messages_ready, "queue-ready"),
      card("unacknowledged", info.messages_unacknowledged, "queue-unacked"),
      card("consumers", info.consumers),
      h("div", { class: "card" }, h("b", {}, info.type), h("span", {}, info.durable ? "durable" : "transient")),
    ),
    h("div", { class: "grid2" },
      chart("Messages", [{ name: "ready", points: samplePoints(info.messages_ready_details) }, { name: "unacknowledged", points: samplePoints(info.messages_unacknowledged_details) }]),
      h("div", {}, h("h2", {}, "Arguments"), h("pre", {}, JSON.stringify(info.arguments, null, 2)), info.policy ? h("p", {}, `policy ${info.policy}`) : null),
    ),
    h("h2", {}, "Bindings"),
    table([
      ["from", (b) => b.source || "(default exchange)"],
      ["routing key", (b) => b.routing_key],
      ["", (b) => (b.source ? h("button", { class: "danger", onclick: async () => {
        if (await attempt(() => api("DELETE", `/api/bindings/${q(vhost)}/e/${q(b.source)}/q/${q(name)}/${q(b.properties_key)}`), "Unbound") !== undefined) location.reload();
      } }, "Unbind") : "")],
    ], bindings),
    bindForm,
    h("h2", {}, "Publish a message"),
    publishForm(vhost, "amq.default", name),
    h("h2", {}, "Get messages"),
    h("p", { class: "muted" }, "Get takes messages as a client does (requeued ones come back marked redelivered). To look without side effects, use ", link(`#/dead-letters/${q(vhost)}/${q(name)}`, "the browser"), "."),
    getForm,
    got,
    h("h2", {}, "Purge or delete"),
    h("div", { class: "toolbar" },
      h("button", { class: "danger", id: "purge", onclick: async () => {
        if (!confirm(`Purge every ready message of ${name}?`)) return;
        if (await attempt(() => api("DELETE", `${path}/contents`), `Purged ${name}`) !== undefined) location.reload();
      } }, "Purge"),
      h("button", { class: "danger", id: "delete-queue", onclick: async () => {
        if (!confirm(`Delete the queue ${name}?`)) return;
        if (await attempt(() => api("DELETE", path), `Deleted ${name}`) !== undefined) location.hash = "#/queues";
      } }, "Delete queue"),
    ),
  );
}

// -- scheduled jobs and the audit trail ----------------------------------------------------
export async function scheduled() {
  const jobs = await api("GET", "/api/scheduled-jobs?limit=500");
  return h("section", {},
    h("h1", {}, "Scheduled and delayed messages"),
    table([
      ["job", (j) => j.job_id],
      ["vhost", (j) => j.vhost],
      ["exchange", (j) => j.exchange],
      ["routing key", (j) => j.routing_key],
      ["next due", (j) => when(j.next_due / 1000)],
      ["", (j) => h("button", { class: "danger", onclick: async () => {
        if (await attempt(() => api("DELETE", `/api/scheduled-jobs/${q(j.vhost)}/${q(j.job_id)}`), "Cancelled") !== undefined) location.reload();
      } }, "Cancel")],
    ], jobs),
  );
}

export async function audit() {
  const entries = await api("GET", "/api/leveret/audit?limit=500");
  return h("section", {},
    h("h1", {}, "Audit log"),
    h("p", { class: "muted" }, isAdmin() ? "Every operator's actions, newest first." : "Your actions, newest first."),
    table([
      ["time", (e) => when(e.time)],
      ["user", (e) => e.user],
      ["from", (e) => e.source],
      ["action", (e) => e.action],
      ["details", (e) => Object.entries(e.details).map(([k, v]) => h("span", { class: "tag" }, `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`))],
    ], entries, { id: "audit-table" }),
  );
}

// -- administration ------------------------------------------------------------------------
export async function admin() {
  const sections = [h("h1", {}, "Admin")];
  if (isAdmin()) {
    const [users, vhosts, permissions] = await Promise.all([api("GET", "/api/users"), api("GET", "/api/vhosts"), api("GET", "/api/permissions")]);
    sections.push(
      h("h2", {}, "Users"),
      table([
        ["name", (u) => u.name],
        ["tags", (u) => (Array.isArray(u.tags) ? u.tags : String(u.tags).split(",")).filter(Boolean).map((t) => h("span", { class: "tag" }, t))],
        ["", (u) => h("button", { class: "danger", onclick: async () => {
          if (confirm(`Delete user ${u.name}?`) && (await attempt(() => api("DELETE", `/api/users/${q(u.name)}`), "Deleted")) !== undefined) location.reload();
        } }, "Delete")],
      ], users, { id: "users-table" }),
      form([["name", "name", { required: true }], ["password", "password", { type: "password" }], ["tags", "tags (comma separated)"]], "Add user", async (v) => {
        if (await attempt(() => api("PUT", `/api/users/${q(v.name)}`, { password: v.password, tags: v.tags }), `User ${v.name} saved`) !== undefined) location.reload();
      }),
      h("h2", {}, "Virtual hosts"),
      table([["name", (v) => v.name], ["messages", (v) => fmt(v.messages), { num: true }], ["", (v) => h("button", { class: "danger", onclick: async () => {
        if (confirm(`Delete vhost ${v.name} and everything in it?`) && (await attempt(() => api("DELETE", `/api/vhosts/${q(v.name)}`), "Deleted")) !== undefined) location.reload();
      } }, "Delete")]], vhosts),
      form([["name", "name", { required: true }]], "Add vhost", async (v) => {
        if (await attempt(() => api("PUT", `/api/vhosts/${q(v.name)}`), `Vhost ${v.name} added`) !== undefined) location.reload();
      }),
      h("h2", {}, "Permissions"),
      table([["user", (p) => p.user], ["vhost", (p) => p.vhost], ["configure", (p) => p.configure], ["write", (p) => p.write], ["read", (p) => p.read]], permissions),
      form([["user", "user", { required: true }], ["vhost", "vhost", { value: "/" }], ["configure", "configure", { value: ".*" }], ["write", "write", { value: ".*" }], ["read", "read", { value: ".*" }]], "Set permission", async (v) => {
        const body = { configure: v.configure, write: v.write, read: v.read };
        if (await attempt(() => api("PUT", `/api/permissions/${q(v.vhost)}/${q(v.user)}`, body), "Permission set") !== undefined) location.reload();
      }),
    );
  }
  const policies = await api("GET", "/api/policies");
  sections.push(
    h("h2", {}, "Policies"),
    table([
      ["vhost", (p) => p.vhost], ["name", (p) => p.name], ["pattern", (p) => p.pattern], ["apply to", (p) => p["apply-to"]],
      ["priority", (p) => p.priority, { num: true }], ["definition", (p) => h("pre", {}, JSON.stringify(p.definition))],
      ["", (p) => h("button", { class: "danger", onclick: async () => {
        if ((await attempt(() => api("DELETE", `/api/policies/${q(p.vhost)}/${q(p.name)}`), "Deleted")) !== undefined) location.reload();
      } }, "Delete")],
    ], policies),
    form([["vhost", "vhost", { value: "/" }], ["name", "name", { required: true }], ["pattern", "pattern", { value: ".*" }], ["apply-to", "apply to", { options: ["queues", "exchanges", "all"] }], ["definition", "definition (JSON)", { value: '{"max-length": 1000}' }]], "Add policy", async (v) => {
      let definition;
      try {
        definition = JSON.parse(v.definition);
      } catch (error) {
        flash(`definition: ${error.message}`, true);
        return;
      }
      const body = { pattern: v.pattern, "apply-to": v["apply-to"], definition, priority: 0 };
      if (await attempt(() => api("PUT", `/api/policies/${q(v.vhost)}/${q(v.name)}`, body), `Policy ${v.name} saved`) !== undefined) location.reload();
    }),
  );
  return h("section", {}, sections);
}
