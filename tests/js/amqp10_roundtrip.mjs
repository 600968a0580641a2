// A browser-style AMQP 1.0 client (the npm `rhea` package, over WebSocket as a web page
// uses it: container.websocket_connect) against leveret's Web AMQP:
//   node amqp10_roundtrip.mjs WS_URL QUEUE OTHER_QUEUE EXPECTED
// Connects (subprotocol "amqp", SASL PLAIN guest/guest), opens a receiver on
// /queues/QUEUE (credit 10, accepting each message itself) and senders to /queues/QUEUE
// and /queues/OTHER_QUEUE (RabbitMQ 4's address v2); sends an amqp-value string with
// properties and application properties and a binary data section to QUEUE, a data
// section and a 300,000-byte one (bytes i % 251) to QUEUE, a data section to OTHER_QUEUE;
// waits for the four outcomes and for EXPECTED messages on the receiver (the three it
// sent, plus what the test put in QUEUE before), then closes and prints one JSON line
// with what it saw.
import { createHash } from "node:crypto";
import rhea from "rhea";
import WebSocket from "ws";

const [url, queue, other, expected] = process.argv.slice(2);
const large = Buffer.alloc(300000);
for (let i = 0; i < large.length; i++) large[i] = i % 251;
const wanted = Number(expected);
const report = { outcomes: [], received: [], errors: [] };
const timeout = setTimeout(() => {
  console.log(JSON.stringify({ error: "timeout", report }));
  process.exit(2);
}, 15000);

// a large body is reported by its length and sha256, not byte by byte
function bytes(buffer) {
  if (buffer.length <= 64) return { bytes: Array.from(buffer) };
  return { length: buffer.length, sha256: createHash("sha256").update(buffer).digest("hex") };
}

function body(value) {
  if (typeof value === "string") return { kind: "string", text: value };
  if (Buffer.isBuffer(value)) return { kind: "binary", ...bytes(value) };
  if (value && value.typecode === 0x75) return { kind: "data", ...bytes(value.content) };
  return { kind: "other", text: JSON.stringify(value) };
}

const container = rhea.create_container({ id: `rhea-${process.pid}` });
const ws = container.websocket_connect(WebSocket);
const connection = container.connect({
  connection_details: ws(url, ["amqp"]),
  username: "guest",
  password: "guest",
  reconnect: false,
  max_frame_size: 65536, // the broker splits the large message for us too
});
let sent = false;
let closing = false;

function maybeClose() {
  if (!closing && report.outcomes.length === 4 && report.received.length === wanted) {
    closing = true;
    connection.close();
  }
}

container.on("connection_open", (context) => {
  context.connection.open_receiver({
    source: { address: `/queues/${queue}` },
    credit_window: 10,
    autoaccept: false,
  });
  const own = context.connection.open_sender({ target: { address: `/queues/${queue}` } });
  const second = context.connection.open_sender({ target: { address: `/queues/${other}` } });
  own.on("sendable", () => {
    if (sent) return;
    sent = true;
    own.send({
      body: "text from rhea",
      message_id: "m1",
      subject: "greeting",
      content_type: "text/plain",
      application_properties: { color: "red", n: 7 },
    });
    own.send({ body: rhea.message.data_section(Buffer.from([0, 1, 2, 255])), message_id: "m2" });
    // larger than the broker's max-frame-size (128 KiB): several transfer frames each way
    own.send({ body: rhea.message.data_section(large), message_id: "m3" });
    second.send({ body: rhea.message.data_section(Buffer.from("for pika")) });
  });
});

for (const outcome of ["accepted", "rejected", "released", "modified"]) {
  container.on(outcome, (context) => {
    report.outcomes.push({ outcome, target: context.sender.target.address });
    maybeClose();
  });
}

container.on("message", (context) => {
  const message = context.message;
  report.received.push({
    message_id: message.message_id ?? null,
    subject: message.subject ?? null,
    content_type: message.content_type ?? null,
    application_properties: message.application_properties ?? null,
    body: body(message.body),
  });
  context.delivery.accept();
  maybeClose();
});

for (const event of ["connection_error", "sender_error", "receiver_error", "error", "protocol_error"]) {
  container.on(event, (context) => {
    const error = context.error ?? context.connection?.error ?? context.sender?.error ?? context.receiver?.error;
    report.errors.push({ event, error: String(error?.description ?? error?.condition ?? error) });
  });
}

container.on("connection_close", () => {
  clearTimeout(timeout);
  console.log(JSON.stringify(report));
  process.exit(report.errors.length ? 3 : 0);
});

container.on("disconnected", (context) => {
  if (closing) return;
  console.log(JSON.stringify({ error: `disconnected: ${context.error ?? ""}`, report }));
  process.exit(4);
});
