// A browser-style MQTT client (the npm `mqtt` package, v5, over WebSocket as a web page
// uses it) against leveret's Web MQTT: node mqtt_roundtrip.mjs WS_URL PREFIX
// For MQTT 3.1.1 and then 5.0: connects (subprotocol "mqtt"), subscribes to
// PREFIX/<version>/# at QoS 1, publishes a QoS 0 and a QoS 1 message (5.0: with user
// properties and a content type) and a binary one, waits for the three, and prints one
// JSON line with what it saw.
import mqtt from "mqtt";

const [url, prefix] = process.argv.slice(2);
const report = {};
const timeout = setTimeout(() => {
  console.log(JSON.stringify({ error: "timeout", report }));
  process.exit(2);
}, 15000);

async function roundtrip(version) {
  const client = await mqtt.connectAsync(url, {
    protocolVersion: version,
    clientId: `js-${version}-${process.pid}`,
    username: "guest",
    password: "guest",
    clean: true,
    reconnectPeriod: 0,
    connectTimeout: 5000,
  });
  const seen = [];
  const all = new Promise((resolve) => {
    client.on("message", (topic, payload, packet) => {
      seen.push({
        topic,
        qos: packet.qos,
        payload: Array.from(payload),
        userProperties: packet.properties?.userProperties ?? null,
        contentType: packet.properties?.contentType ?? null,
      });
      if (seen.length === 3) resolve();
    });
  });
  const granted = await client.subscribeAsync(`${prefix}/${version}/#`, { qos: 1 });
  const extra = version === 5 ? { properties: { userProperties: { color: "red" }, contentType: "text/plain" } } : {};
  await client.publishAsync(`${prefix}/${version}/zero`, "qos 0 from mqtt.js", { qos: 0 });
  await client.publishAsync(`${prefix}/${version}/one`, "qos 1 from mqtt.js", { qos: 1, ...extra });
  await client.publishAsync(`${prefix}/${version}/bytes`, Buffer.from([0, 1, 2, 255]), { qos: 1 });
  await all;
  await client.endAsync();
  seen.sort((a, b) => a.topic.localeCompare(b.topic));
  return { granted: granted.map((g) => g.qos), seen };
}

try {
  report["4"] = await roundtrip(4);
  report["5"] = await roundtrip(5);
  clearTimeout(timeout);
  console.log(JSON.stringify(report));
} catch (error) {
  console.log(JSON.stringify({ error: String(error), report }));
  process.exit(3);
}
