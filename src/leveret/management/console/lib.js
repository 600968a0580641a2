// The console's building blocks: calls to the API (with the session's CSRF token),
// DOM construction that never parses data as HTML, tables, charts, messages.

export const session = { user: null, tags: [], csrf: null };

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

let onLoggedOut = () => {};
export function whenLoggedOut(callback) {
  onLoggedOut = callback;
}

// `method path` with `body` as JSON; the answer's JSON, or ApiError with the API's reason.
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { reason: text };
  }
  if (response.status === 401 && session.user && !path.startsWith("/api/leveret/session")) {
    onLoggedOut();
  }
  if (!response.ok) {
    const reason = data && data.reason !== undefined ? data.reason : response.statusText;
    throw new ApiError(response.status, typeof reason === "string" ? reason : JSON.stringify(reason));
  }
  return data;
}

// An element: h("td", {class: "num"}, "12"). Strings become text nodes, never HTML.
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export const q = (name) => encodeURIComponent(name);
export const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 1 }) : n ?? "");
export const when = (seconds) => (seconds ? new Date(seconds * 1000).toLocaleString() : "");

// A table: columns are [title, row => cell, {num: true}?].
export function table(columns, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, columns.map(([title, , o]) => h("th", { class: o && o.num ? "num" : null }, title)))),
    h(
      "tbody",
      {},
      rows.length
        ? rows.map((row) => h("tr", {}, columns.map(([, cell, o]) => h("td", { class: o && o.num ? "num" : null }, cell(row)))))
        : h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "Nothing here.")),
    ),
  );
}

export function flash(text, isError = false) {
  const box = document.getElementById("flash");
  const line = h("div", { class: isError ? "error" : null }, text);
  box.replaceChildren(line);
  setTimeout(() => line.remove(), isError ? 8000 : 4000);
}

// Run `action`, show its error (and return undefined) instead of throwing.
export async function attempt(action, success) {
  try {
    const result = await action();
    if (success) flash(success);
    return result;
  } catch (error) {
    flash(error.message || String(error), true);
    return undefined;
  }
}

const COLOURS = ["#d9822b", "#2f6fb0", "#2a9d5c", "#b23a48", "#7a5bb5", "#5f6b7a"];

// An SVG line chart of series [{name, points: [[t, value], ...]}] (t in ms), with a legend.
export function chart(title, series, unit = "") {
  const width = 600, height = 160, pad = 30;
  const all = series.flatMap((s) => s.points);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const figure = h("div", { class: "chart" }, h("b", {}, title), svg);
  if (all.length < 2) {
    figure.append(h("div", { class: "muted" }, "Collecting samples…"));
    return figure;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = Math.max(1, ...all.map((p) => p[1]));
  const x = (t) => pad + ((t - t0) / Math.max(1, t1 - t0)) * (width - pad - 5);
  const y = (v) => height - 15 - (v / top) * (height - 25);
  const line = (x1, y1, x2, y2, colour) => {
    const l = document.createElementNS(svg.namespaceURI, "line");
    Object.entries({ x1, y1, x2, y2, stroke: colour }).forEach(([k, v]) => l.setAttribute(k, v));
    svg.append(l);
  };
  line(pad, y(0), width - 5, y(0), "#ccc");
  figure.insertBefore(h("span", { class: "muted scale" }, ` (top: ${fmt(top)}${unit})`), svg);
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const path = document.createElementNS(svg.namespaceURI, "polyline");
    path.setAttribute("points", s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", COLOURS[i % COLOURS.length]);
    path.setAttribute("stroke-width", 2);
    svg.append(path);
  });
  figure.append(
    h("div", { class: "legend" }, series.map((s, i) => h("span", {}, h("i", { style: `background:${COLOURS[i % COLOURS.length]}` }), `${s.name}: ${fmt(s.points.at(-1)?.[1] ?? 0)}${unit}`))),
  );
  return figure;
}

// Points of a `*_details.samples` list (newest first) as [t, value], oldest first.
export const samplePoints = (details) => (details && details.samples ? details.samples.map((s) => [s.timestamp, s.sample]).reverse() : []);

// Rates (per second) between consecutive samples of a counter.
export function ratePoints(details) {
  const points = samplePoints(details);
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    const seconds = (points[i][0] - points[i - 1][0]) / 1000;
    if (seconds > 0) rates.push([points[i][0], Math.max(0, (points[i][1] - points[i - 1][1]) / seconds)]);
  }
  return rates;
}

// A form whose fields are [name, label, attrs]; `submit(values)` on submit.
export function form(fields, buttonText, submit, attrs = {}) {
  const element = h(
    "form",
    { class: "inline", ...attrs },
    fields.map(([name, text, a]) =>
      h("label", {}, text, a && a.options ? h("select", { name }, a.options.map((o) => h("option", { value: o }, o))) : h(a && a.textarea ? "textarea" : "input", { name, ...(a || {}) })),
    ),
    h("button", { type: "submit" }, buttonText),
  );
  element.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = Object.fromEntries(new FormData(element).entries());
    submit(values, element);
  });
  return element;
}

// Stacked bars of series [{name, points: [[t, value], ...]}] sharing their times (ms).
export function bars(title, series) {
  const width = 600, height = 160;
  const times = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const figure = h("div", { class: "chart" }, h("b", {}, title), svg);
  if (!times.length) {
    figure.append(h("div", { class: "muted" }, "None."));
    return figure;
  }
  const value = (s, t) => (s.points.find((p) => p[0] === t) || [t, 0])[1];
  const totals = times.map((t) => series.reduce((sum, s) => sum + value(s, t), 0));
  const top = Math.max(1, ...totals);
  const slot = width / Math.max(times.length, 12);
  times.forEach((t, i) => {
    let base = height - 2;
    series.forEach((s, k) => {
      const size = (value(s, t) / top) * (height - 10);
      if (!size) return;
      const rect = document.createElementNS(svg.namespaceURI, "rect");
      const attrs = { x: i * slot + 2, y: base - size, width: Math.max(2, slot - 4), height: size, fill: COLOURS[k % COLOURS.length] };
      Object.entries(attrs).forEach(([key, v]) => rect.setAttribute(key, v));
      const tip = document.createElementNS(svg.namespaceURI, "title");
      tip.textContent = `${new Date(t).toLocaleTimeString()}: ${s.name} ${value(s, t)}`;
      rect.append(tip);
      svg.append(rect);
      base -= size;
    });
  });
  figure.insertBefore(h("span", { class: "muted scale" }, ` (top: ${fmt(top)}; ${new Date(times[0]).toLocaleTimeString()} – ${new Date(times.at(-1)).toLocaleTimeString()})`), svg);
  figure.append(h("div", { class: "legend" }, series.map((s, i) => h("span", {}, h("i", { style: `background:${COLOURS[i % COLOURS.length]}` }), `${s.name}: ${fmt(s.points.reduce((n, p) => n + p[1], 0))}`))));
  return figure;
}
