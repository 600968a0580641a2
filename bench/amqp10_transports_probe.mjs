// The client of bench/amqp10_transports_probe.py: rhea (tests/js/node_modules) on one
// connection sends COUNT messages of SIZE bytes to /queues/QUEUE (unsettled: each
// waits for its accepted outcome, within the link credit the broker grants) and
// receives them on the same connection (credit window 500, accepting each), then
// prints one JSON line: {"seconds": ..., "received": ...} or {"error": ...}.
//   node amqp10_transports_probe.mjs tcp|tls|ws ADDRESS QUEUE COUNT SIZE [CA_FILE]
// ADDRESS is HOST:PORT (tcp, tls) or ws://HOST:PORT/ws.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(fileURLToPath(new URL("../tests/js/package.json", import.meta.url)));
const rhea = require("rhea");
const WebSocket = require("ws");

const [transport, address, queue, countText, sizeText, ca] = process.argv.slice(2);
const count = Number(countText);
const body = rhea.message.data_section(Buffer.alloc(Number(sizeText), 120));
const container = rhea.create_container({ id: `probe-${process.pid}` });
const login = { username: "guest", password: "guest", reconnect: false, idle_time_out: 0 };
let options;
if (transport === "ws") {
  options = { ...login, connection_details: container.websocket_connect(WebSocket)(address, ["amqp"]) };
} else {
  const [host, port] = address.split(":");
  options = { ...login, host, port: Number(port) };
  if (transport === "tls") Object.assign(options, { transport: "tls", ca: readFileSync(ca), servername: host });
}
const failed = (why) => {
  console.log(JSON.stringify({ error: String(why) }));
  process.exit(1);
};
setTimeout(() => failed("timeout"), 120000);

let sent = 0;
let received = 0;
let started = 0;
container.on("connection_open", (context) => {
  started = process.hrtime.bigint();
  context.connection.open_receiver({ source: { address: `/queues/${queue}` }, credit_window: 500 });
  context.connection.open_sender({ target: { address: `/queues/${queue}` } });
});
container.on("sendable", (context) => {
  while (sent < count && context.sender.sendable()) {
    context.sender.send({ body });
    sent += 1;
  }
});
container.on("message", (context) => {
  received += 1;
  if (received === count) {
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    console.log(JSON.stringify({ seconds, received }));
    context.connection.close();
  }
});
container.on("connection_close", () => process.exit(0));
container.on("disconnected", (context) => {
  if (received < count) failed(`disconnected: ${context.error ?? "closed"}`);
});
for (const event of ["connection_error", "sender_error", "receiver_error", "error"]) {
  container.on(event, (context) => failed(`${event}: ${JSON.stringify(context.error ?? context.connection?.error)}`));
}
container.connect(options);
