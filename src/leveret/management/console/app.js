// The console's entry: login, navigation, and which page a #/path shows.
import { ApiError, api, h, session, whenLoggedOut } from "/console/lib.js";
import * as pages from "/console/pages.js";
import * as deadLetters from "/console/dead_letters.js";
import * as federation from "/console/federation.js";
import * as nodes from "/console/nodes.js";

const main = document.getElementById("main");
let refresh = null; // the current page's refresh timer

// #/path → page(params); the first match wins.
const ROUTES = [
  [/^\/$/, pages.overview],
  [/^\/connections$/, pages.connections],
  [/^\/connections\/([^/]+)$/, pages.connection],
  [/^\/channels$/, pages.channels],
  [/^\/exchanges$/, pages.exchanges],
  [/^\/exchanges\/([^/]+)\/([^/]*)$/, pages.exchange],
  [/^\/queues$/, pages.queues],
  [/^\/queues\/([^/]+)\/([^/]+)$/, pages.queue],
  [/^\/dead-letters$/, deadLetters.list],
  [/^\/dead-letters\/([^/]+)\/([^/]+)$/, deadLetters.browse],
  [/^\/federation$/, federation.links],
  [/^\/nodes$/, nodes.nodes],
  [/^\/scheduled$/, pages.scheduled],
  [/^\/audit$/, pages.audit],
  [/^\/admin$/, pages.admin],
];

function showLoggedIn() {
  const isAdmin = session.tags.includes("administrator") || session.tags.includes("policymaker");
  document.getElementById("nav").hidden = false;
  document.getElementById("nav-admin").hidden = !isAdmin;
  document.getElementById("nav-federation").hidden = !federation.mayMonitor();
  document.getElementById("nav-nodes").hidden = !federation.mayMonitor();
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = `${session.user} (${session.tags.join(", ") || "no tags"})`;
}

function showLogin(message) {
  Object.assign(session, { user: null, tags: [], csrf: null });
  clearInterval(refresh);
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const error = h("p", { class: "error", id: "login-error" }, message || "");
  const loginForm = h(
    "form",
    { id: "login-form" },
    h("label", {}, "Username", h("input", { name: "username", autocomplete: "username", required: true })),
    h("label", {}, "Password", h("input", { name: "password", type: "password", autocomplete: "current-password" })),
    h("button", { type: "submit" }, "Log in"),
    error,
  );
  loginForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = Object.fromEntries(new FormData(loginForm).entries());
    try {
      const answer = await api("POST", "/api/leveret/session", values);
      Object.assign(session, { user: answer.user, tags: answer.tags, csrf: answer.csrf_token });
      showLoggedIn();
      route();
    } catch (failure) {
      error.textContent = failure instanceof ApiError && failure.status === 401 ? `Login failed: ${failure.message}` : failure.message;
    }
  });
  main.replaceChildren(h("div", { class: "login" }, h("h1", {}, "Log in to leveret"), loginForm));
}

async function route() {
  if (!session.user) return;
  clearInterval(refresh);
  const path = decodeURIComponent(location.hash.replace(/^#/, "") || "/");
  for (const link of document.querySelectorAll("nav a")) {
    const target = link.getAttribute("href").slice(1);
    link.classList.toggle("active", target === "/" ? path === "/" : path.startsWith(target));
  }
  const raw = location.hash.replace(/^#/, "") || "/";
  for (const [pattern, page] of ROUTES) {
    const match = raw.match(pattern);
    if (match) {
      const params = match.slice(1).map(decodeURIComponent);
      const render = async () => {
        try {
          const content = await page(...params);
          if (content) main.replaceChildren(content);
        } catch (error) {
          main.replaceChildren(h("p", { class: "error" }, error.message || String(error)));
        }
      };
      await render();
      if (page.refreshEvery) refresh = setInterval(render, page.refreshEvery);
      return;
    }
  }
  main.replaceChildren(h("p", { class: "error" }, `No page ${path}`));
}

document.getElementById("logout").addEventListener("click", async () => {
  try {
    await api("DELETE", "/api/leveret/session");
  } finally {
    showLogin("Logged out.");
  }
});
window.addEventListener("hashchange", route);
whenLoggedOut(() => showLogin("Your session ended: log in again."));

try {
  const answer = await api("GET", "/api/leveret/session");
  Object.assign(session, { user: answer.user, tags: answer.tags, csrf: answer.csrf_token });
  showLoggedIn();
  route();
} catch {
  showLogin();
}
