// The nodes page: every node of the cluster with its state (running or stopped, and
// leveret's own state: running / left), as RabbitMQ's Overview lists its cluster's nodes
// from /api/nodes; a single broker shows itself. As RabbitMQ's API, /api/nodes takes the
// monitoring or administrator tag (the page says so rather than ask).
import { api, fmt, h, table } from "/console/lib.js";
import { mayMonitor } from "/console/federation.js";

const card = (label, value, id) => h("div", { class: "card", id }, h("b", {}, String(value)), h("span", {}, label));
// "running" green, a stopped node red, as a tag.
const state = (n) => h("span", { class: `tag node-state ${n.running ? "ok" : "error"}` }, n.running ? (n.state || "running") : `stopped${n.state ? ` (${n.state})` : ""}`);
const uptime = (ms) => {
  if (typeof ms !== "number") return "";
  const s = Math.floor(ms / 1000), d = Math.floor(s / 86400), hrs = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hrs}h` : hrs ? `${hrs}h ${m}m` : `${m}m ${s % 60}s`;
};
const mib = (bytes) => (typeof bytes === "number" ? `${fmt(bytes / 1048576)} MiB` : "");

export async function nodes() {
  if (!mayMonitor()) {
    return h("section", { id: "nodes" }, h("h1", {}, "Nodes"),
      h("p", { class: "error", id: "nodes-refused" }, "The nodes need the monitoring or administrator tag (Not monitor user)."));
  }
  const [rows, overview] = await Promise.all([api("GET", "/api/nodes"), api("GET", "/api/overview")]);
  return h("section", { id: "nodes" },
    h("h1", {}, `Nodes of ${overview.cluster_name}`),
    h("div", { class: "cards" },
      card("nodes", rows.length, "nodes-total"),
      card("running", rows.filter((n) => n.running).length, "nodes-running"),
      card("stopped", rows.filter((n) => !n.running).length, "nodes-stopped")),
    table([
      ["name", (n) => (n.name === overview.node ? h("span", {}, n.name, " ", h("span", { class: "tag" }, "this node")) : n.name)],
      ["state", state],
      ["uptime", (n) => (n.running ? uptime(n.uptime) : "")],
      ["queues", (n) => n.queues ?? "", { num: true }],
      ["AMQP", (n) => n.amqp || (n.amqp_port ? `${n.host || ""}:${n.amqp_port}` : "")],
      ["memory", (n) => mib(n.mem_used), { num: true }],
      ["file descriptors", (n) => (typeof n.fd_used === "number" ? `${n.fd_used} / ${n.fd_total}` : ""), { num: true }],
    ], rows, { id: "nodes-table" }),
  );
}
nodes.refreshEvery = 5000;
