import { useState } from "preact/hooks";
import { Permission } from "../../../stubs/ts/gen/postbox/v1/access_service_pb.js";
import { access, listAll } from "../api.js";
import { time } from "../format.js";
import { ErrorLine, html, useAction, usePoll } from "../ui.js";

function grantText(grant) {
  return `${(Permission[grant.permission] ?? "").toLowerCase()}:${grant.pattern}`;
}

function parseGrants(text) {
  return text.split(/[\s,]+/).filter(Boolean).map((item) => {
    const at = item.indexOf(":");
    const permission = Permission[(at < 0 ? item : item.slice(0, at)).toUpperCase()];
    if (permission === undefined || permission === Permission.UNSPECIFIED) {
      throw new Error(`a grant reads permission:pattern, e.g. read:orders-*; not ${item}`);
    }
    return { permission, pattern: at < 0 ? "*" : item.slice(at + 1) };
  });
}

export function Keys() {
  const [name, setName] = useState("");
  const [grants, setGrants] = useState("read:*");
  const [created, setCreated] = useState(null);
  const [revoking, setRevoking] = useState(null);
  const action = useAction();
  const [found, error, reload] = usePoll(() => listAll(access.listKeys, {}, "keys"), []);
  const create = () =>
    action.run(async () => {
      const response = await access.createKey({ key: { name, grants: parseGrants(grants) } });
      setCreated({ name: response.key.name, secret: response.secret });
      setName("");
      reload();
    });
  const revoke = (key) =>
    action.run(async () => {
      await access.deleteKey({ name: key });
      setRevoking(null);
      reload();
    });
  return html`<section>
    <h2>API keys</h2>
    <form class="card inline" onSubmit=${(event) => { event.preventDefault(); create(); }}>
      <input id="key-name" placeholder="name" value=${name} onInput=${(e) => setName(e.currentTarget.value)} />
      <input id="key-grants" placeholder="grants, e.g. read:* send:orders-*" size="40" value=${grants}
        onInput=${(e) => setGrants(e.currentTarget.value)} />
      <button type="submit" id="create-key" disabled=${action.busy || !name}>Create key</button>
    </form>
    ${created ? html`<div class="card secret" id="new-secret">
      <p>The secret of <b>${created.name}</b>, shown this once: copy it now.</p>
      <pre class="mono">${created.secret}</pre>
      <button type="button" onClick=${() => setCreated(null)}>Done</button>
    </div>` : null}
    <${ErrorLine} error=${action.error || error} />
    <table>
      <thead><tr><th>Name</th><th>Grants</th><th>Expires</th><th>Created</th><th></th></tr></thead>
      <tbody>${(found ?? []).map((key) => html`<tr key=${key.name} data-key=${key.name}>
        <td>${key.name}</td>
        <td class="mono">${key.grants.map(grantText).join(" ")}</td>
        <td>${time(key.expireTime)}</td>
        <td>${time(key.createTime)}</td>
        <td>${revoking === key.name
          ? html`<span class="confirm">Revoke ${key.name}?
              <button type="button" class="danger" onClick=${() => revoke(key.name)}>Revoke</button>
              <button type="button" onClick=${() => setRevoking(null)}>Cancel</button></span>`
          : html`<button type="button" class="danger" onClick=${() => setRevoking(key.name)}>Revoke…</button>`}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}
