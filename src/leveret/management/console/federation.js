// The federation page: every link (one upstream of one federated exchange or queue) with
// its state, as RabbitMQ's "Federation Status" page lists /api/federation-links, and a
// restart button per link. As RabbitMQ's API, it takes the monitoring or administrator
// tag (the page says so rather than ask: any 401 ends the console's session).
import { api, attempt, h, q, session, table } from "/console/lib.js";

export const mayMonitor = () => session.tags.includes("monitoring") || session.tags.includes("administrator");

const STATES = ["running", "starting", "error", "shutdown"];
const count = (rows, state) => rows.filter((l) => l.status === state).length;
const card = (label, value, id) => h("div", { class: "card", id }, h("b", {}, String(value)), h("span", {}, label));
// "running" green, "error" red, the others plain, as a tag.
const state = (l) => h("span", { class: `tag link-state ${l.status === "running" ? "ok" : l.status === "error" ? "error" : ""}` }, l.status);
const restartPath = (l) => `/api/federation-links/vhost/${q(l.vhost)}/${q(l.id)}/${q(l.node)}/restart`;

export async function links() {
  if (!mayMonitor()) {
    return h("section", { id: "federation" }, h("h1", {}, "Federation links"),
      h("p", { class: "error", id: "federation-refused" }, "Federation status needs the monitoring or administrator tag (Not monitor user)."));
  }
  const rows = await api("GET", "/api/federation-links");
  return h("section", { id: "federation" },
    h("h1", {}, "Federation links"),
    h("div", { class: "cards" }, STATES.map((s) => card(s, count(rows, s), `links-${s}`))),
    table([
      ["upstream", (l) => l.upstream],
      ["vhost", (l) => l.vhost],
      ["type", (l) => l.type],
      ["exchange / queue", (l) => (l.type === "queue" ? l.queue : l.exchange)],
      ["upstream exchange / queue", (l) => (l.type === "queue" ? l.upstream_queue : l.upstream_exchange)],
      ["URI", (l) => l.uri],
      ["state", state],
      ["error / local connection", (l) => (l.status === "running" ? l.local_connection || "" : h("span", { class: "error" }, l.error || ""))],
      ["since", (l) => l.timestamp],
      ["", (l) => h("button", { class: "restart", onclick: async () => {
        if (await attempt(() => api("DELETE", restartPath(l)), `Restarting link ${l.id}`) !== undefined) location.hash = "#/federation";
      } }, "Restart")],
    ], rows, { id: "federation-links" }),
  );
}
links.refreshEvery = 5000;
