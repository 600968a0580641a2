"""mqtt.js (the npm ``mqtt`` v5 package's browser bundle) in headless chromium, as a web
page uses it, against leveret's Web MQTT (``ws://HOST:PORT/ws``): MQTT 3.1.1 and 5.0,
subscribe, publish at QoS 0 and 1, receive."""

from __future__ import annotations

from pathlib import Path

import pytest

from leveret import BlockingBroker

BUNDLE = Path(__file__).resolve().parent.parent / "js" / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"

ROUND_TRIP = """
const [url, bundle, done] = arguments;
const report = { stage: "load" };
(async () => {
  if (typeof mqtt === "undefined") {  // the page's script tag may not have run yet
    await new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = bundle;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`cannot load ${bundle}`));
      document.head.appendChild(script);
    });
  }
  for (const version of [4, 5]) {
    report.stage = `connect ${version}`;
    const client = await mqtt.connectAsync(url, {
      protocolVersion: version, clientId: `browser-${version}`, reconnectPeriod: 0, connectTimeout: 10000,
    });
    const seen = [];
    const all = new Promise((resolve) => client.on("message", (topic, payload, packet) => {
      seen.push([topic, packet.qos, Array.from(payload)]);
      if (seen.length === 2) resolve();
    }));
    report.stage = `subscribe ${version}`;
    await client.subscribeAsync(`browser/${version}/#`, { qos: 1 });
    report.stage = `publish ${version}`;
    await client.publishAsync(`browser/${version}/zero`, "qos 0", { qos: 0 });
    await client.publishAsync(`browser/${version}/one`, new Uint8Array([0, 1, 255]), { qos: 1 });
    report.stage = `receive ${version}`;
    await all;
    await client.endAsync();
    report[version] = seen.sort();
  }
  return report;
})().then(done, (error) => done({ error: String(error), stage: report.stage }));
"""


@pytest.mark.skipif(not BUNDLE.exists(), reason="tests/js/node_modules (npm ci --prefix tests/js) is missing")
def test_mqtt_js_in_chromium_over_web_mqtt(driver, tmp_path):
    page = tmp_path / "mqtt.html"
    page.write_text("<!doctype html><title>mqtt.js</title>\n")
    with BlockingBroker(amqp_port=0, web_mqtt_port=0) as broker:
        driver.get(page.as_uri())
        driver.set_script_timeout(30)
        report = driver.execute_async_script(ROUND_TRIP, broker.web_mqtt_url, BUNDLE.as_uri())
    assert "error" not in report, report
    for version in ("4", "5"):
        assert report[version] == [
            [f"browser/{version}/one", 1, [0, 1, 255]],
            [f"browser/{version}/zero", 0, list(b"qos 0")],
        ]
