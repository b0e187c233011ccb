// The single-page app: a hash router over the pages, sign-in with an API key, and a header
// that shows who is signed in. Every page reads only the /v1 API.

import { ApiError, get, session, type Me } from "./api";
import { errorBox, h } from "./dom";
import { contractsPage, fleetPage } from "./pages/more";
import { runPage } from "./pages/run";
import { runsPage } from "./pages/runs";
import { workflowPage, workflowsPage } from "./pages/workflows";

export interface Ctx {
  me: Me;
  main: HTMLElement;
  params: URLSearchParams;
  signal: AbortSignal;
}

let me: Me | null = null;
let leaving: AbortController | null = null;

function signIn(main: HTMLElement, message = ""): void {
  document.title = "Sign in · Accord";
  const input = h("input", { id: "key", name: "key", type: "password", autocomplete: "off", required: true, "aria-describedby": "key-help" });
  const form = h(
    "form",
    { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("label", { for: "key" }, "API key or token"),
    input,
    h("p", { id: "key-help", class: "help" }, "Kept in this tab only (sessionStorage) and sent as a bearer token to this server."),
    message ? h("p", { class: "error", role: "alert" }, message) : null,
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    session.set(input.value.trim());
    me = null;
    void route();
  });
  main.replaceChildren(form);
  input.focus();
}

async function whoami(): Promise<Me | null> {
  if (me) return me;
  if (!session.key()) return null;
  me = await get<Me>("/v1/me");
  return me;
}

async function route(): Promise<void> {
  leaving?.abort();
  leaving = new AbortController();
  const main = document.getElementById("main") as HTMLElement;
  const nav = document.getElementById("nav") as HTMLElement;
  const who = document.getElementById("who") as HTMLElement;
  const out = document.getElementById("signout") as HTMLButtonElement;
  let principal: Me | null;
  try {
    principal = await whoami();
  } catch (err) {
    session.clear();
    me = null;
    const text = err instanceof ApiError && err.status === 401 ? "That key was not accepted." : err instanceof Error ? err.message : String(err);
    nav.hidden = out.hidden = true;
    who.textContent = "";
    signIn(main, text);
    return;
  }
  if (!principal) {
    nav.hidden = out.hidden = true;
    who.textContent = "";
    signIn(main);
    return;
  }
  nav.hidden = out.hidden = false;
  who.textContent = `${principal.principal} · ${principal.role} · ${principal.tenants.join(", ")}`;
  const [path = "", query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of nav.querySelectorAll("a")) {
    const here = a.getAttribute("href") === `#/${parts[0] ?? "runs"}`;
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  // each route draws into a view of its own: a slower page that is left cannot draw over the next
  const view = h("div", { class: "view" }, h("p", { class: "loading" }, "Loading…"));
  main.replaceChildren(view);
  const ctx: Ctx = { me: principal, main: view, params: new URLSearchParams(query), signal: leaving.signal };
  try {
    if (parts[0] === "runs" && parts[1]) await runPage(ctx, parts[1]);
    else if (parts[0] === "workflows" && parts[1]) await workflowPage(ctx, parts[1]);
    else if (parts[0] === "workflows") await workflowsPage(ctx);
    else if (parts[0] === "contracts") await contractsPage(ctx, parts[1]);
    else if (parts[0] === "fleet") await fleetPage(ctx);
    else await runsPage(ctx);
  } catch (err) {
    if (ctx.signal.aborted) return;
    view.replaceChildren(errorBox(err));
  }
}

function start(): void {
  (document.getElementById("signout") as HTMLButtonElement).addEventListener("click", () => {
    session.clear();
    me = null;
    location.hash = "#/runs";
    void route();
  });
  window.addEventListener("hashchange", () => void route());
  void route();
}

start();
