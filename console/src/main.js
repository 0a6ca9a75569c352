// The postbox web console: a hash-routed preact app over the HTTP API (see api.js).
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { currentSession, login, logout, useSession } from "./api.js";
import { accessOf } from "./access.js";
import { html } from "./ui.js";
import { MessageDetail } from "./views/jobs.js";
import { Keys } from "./views/keys.js";
import { Overview } from "./views/overview.js";
import { QueueDetail } from "./views/queue.js";
import { Schedules } from "./views/schedules.js";
import { TenantDetail, TenantList } from "./views/tenants.js";
import { TopicDetail, TopicList } from "./views/topics.js";

function useRoute() {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const changed = () => setHash(location.hash);
    addEventListener("hashchange", changed);
    return () => removeEventListener("hashchange", changed);
  }, []);
  return hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
}

function Login({ onSignedIn, message }) {
  const [secret, setSecret] = useState("");
  const [error, setError] = useState(message);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onSignedIn(await login(secret));
    } catch (failure) {
      setError(failure.message);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="login">
    <form class="card" onSubmit=${submit}>
      <h1>postbox</h1>
      <label for="api-key">API key</label>
      <input id="api-key" type="password" autocomplete="off" value=${secret}
        onInput=${(event) => setSecret(event.currentTarget.value)} />
      <button type="submit" id="login" disabled=${busy || !secret}>Log in</button>
      ${error ? html`<p class="error" role="alert">${error}</p>` : null}
      <p class="muted">The key stays on the server, in this browser's session.</p>
    </form>
  </main>`;
}

function Page({ route, access }) {
  const [section, name, part, id] = route;
  if (section === "queues" && name && part === "messages" && id)
    return html`<${MessageDetail} key=${id} queue=${name} id=${id} />`;
  if (section === "queues" && name) return html`<${QueueDetail} key=${name} name=${name} access=${access} />`;
  if (section === "topics" && name) return html`<${TopicDetail} key=${name} name=${name} access=${access} />`;
  if (section === "topics") return html`<${TopicList} />`;
  if (section === "schedules") return html`<${Schedules} access=${access} />`;
  if (section === "keys" && access.can("admin", "*")) return html`<${Keys} />`;
  if (section === "tenants" && name && access.managesTenants)
    return html`<${TenantDetail} key=${name} name=${name} />`;
  if (section === "tenants" && access.managesTenants) return html`<${TenantList} />`;
  return html`<${Overview} />`;
}

function App() {
  const [session, setSession] = useState(null);
  const [problem, setProblem] = useState(null);
  const route = useRoute();
  const adopt = (found) => {
    useSession(found.csrf, () => refresh("Your session ended: log in again."));
    setSession(found);
  };
  const refresh = async (message) => {
    try {
      const found = await currentSession();
      adopt(found);
      setProblem(found.signedIn ? null : message ?? null);
    } catch (error) {
      setProblem(`The server did not answer: ${error.message}`);
    }
  };
  useEffect(() => { refresh(); }, []);
  if (!session) return html`<main><p class="muted">${problem ?? "Loading…"}</p></main>`;
  if (!session.signedIn) return html`<${Login} onSignedIn=${adopt} message=${problem} />`;
  const access = accessOf(session);
  const signOut = async () => {
    await logout().catch(() => {});
    refresh();
  };
  const [section] = route;
  const tab = (href, label, current) =>
    html`<a href=${href} class=${current ? "current" : ""}>${label}</a>`;
  return html`<div class="shell">
    <header>
      <h1>postbox</h1>
      <nav>
        ${tab("#/", "Queues", !section || section === "queues")}
        ${tab("#/topics", "Topics", section === "topics")}
        ${tab("#/schedules", "Schedules", section === "schedules")}
        ${access.can("admin", "*") ? tab("#/keys", "Keys", section === "keys") : null}
        ${access.managesTenants ? tab("#/tenants", "Tenants", section === "tenants") : null}
      </nav>
      <span class="who" id="who">${session.auth ? `key ${access.name}` : "open (no API keys exist)"}</span>
      ${session.auth ? html`<button type="button" id="logout" onClick=${signOut}>Log out</button>` : null}
    </header>
    <main><${Page} route=${route} access=${access} /></main>
  </div>`;
}

render(html`<${App} />`, document.getElementById("app"));
