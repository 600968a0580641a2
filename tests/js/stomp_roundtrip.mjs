// A browser-style STOMP client (@stomp/stompjs over WebSocket, as a web page uses it)
// against leveret: node stomp_roundtrip.mjs WS_URL QUEUE
// Reads the message waiting on QUEUE (put there by the Python test over AMQP), then
// sends a text and a binary message to itself with client-individual acks, and prints
// one JSON line with what it saw.
import { Client } from "@stomp/stompjs";
import WebSocket from "ws";

const [url, queue] = process.argv.slice(2);
const seen = [];
const client = new Client({
  webSocketFactory: () => new WebSocket(url, ["v12.stomp", "v11.stomp", "v10.stomp"]),
  connectHeaders: { login: "guest", passcode: "guest" },
  reconnectDelay: 0,
  heartbeatIncoming: 0,
  heartbeatOutgoing: 0,
});
const timeout = setTimeout(() => { console.log(JSON.stringify({ error: "timeout", seen })); process.exit(2); }, 10000);
client.onStompError = (frame) => { console.log(JSON.stringify({ error: frame.headers.message, seen })); process.exit(3); };
client.onConnect = (connected) => {
  client.subscribe(`/queue/${queue}`, (message) => {
    seen.push({ headers: message.headers, body: Array.from(message.binaryBody) });
    message.ack();
    if (seen.length === 1) {
      client.publish({ destination: `/queue/${queue}`, body: "from stomp.js", headers: { color: "red" } });
    } else if (seen.length === 2) {
      client.publish({ destination: `/queue/${queue}`, binaryBody: new Uint8Array([0, 1, 2, 255]),
                       headers: { "content-type": "application/octet-stream" } });
    } else {
      clearTimeout(timeout);
      console.log(JSON.stringify({ version: connected.headers.version, seen }));
      client.deactivate().then(() => process.exit(0));
    }
  }, { ack: "client-individual" });
};
client.activate();
