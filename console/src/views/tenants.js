import { access, listAll } from "../api.js";
import { count, rate, time } from "../format.js";
import { ErrorLine, html, usePoll } from "../ui.js";

export function TenantList() {
  const [found, error] = usePoll(() => listAll(access.listTenants, {}, "tenants"), []);
  return html`<section>
    <h2>Tenants</h2>
    <${ErrorLine} error=${error} />
    <table id="tenants">
      <thead><tr><th>Name</th><th>Account id</th><th>Description</th><th>Created</th></tr></thead>
      <tbody>${(found ?? []).map((tenant) => html`<tr key=${tenant.name} data-tenant=${tenant.name}>
        <td><a href=${`#/tenants/${encodeURIComponent(tenant.name)}`}>${tenant.name}</a></td>
        <td class="mono">${tenant.accountId}</td>
        <td>${tenant.description}</td>
        <td>${time(tenant.createTime)}</td>
      </tr>`)}</tbody>
    </table>
    ${found && found.length === 0 ? html`<p class="muted">No tenants.</p>` : null}
  </section>`;
}

// "12 / 100 queues", or "12 queues (no limit)" when the quota is 0 (none).
function usageText(used, limit, unit) {
  return Number(limit ?? 0) > 0
    ? `${count(used)} / ${count(limit)} ${unit}`
    : `${count(used)} ${unit} (no limit)`;
}

// A token bucket's rate and burst; 0 per second is no limit, 0 burst is one second's worth.
function limitText(perSecond, burst) {
  if (!perSecond) return "no limit";
  return `${rate(perSecond)} / s, burst ${burst ? count(burst) : "one second's worth"}`;
}

export function TenantDetail({ name }) {
  const [found, error] = usePoll(() => access.getTenant({ name }), [name]);
  const tenant = found?.tenant;
  const usage = found?.usage ?? {};
  const quota = tenant?.quota ?? {};
  const limits = tenant?.rateLimits ?? {};
  return html`<section>
    <p><a href="#/tenants">← Tenants</a></p>
    <h2>Tenant ${name}</h2>
    <${ErrorLine} error=${error} />
    ${tenant ? html`<div class="card">
      <dl class="fields">
        <dt>Account id</dt><dd class="mono" id="tenant-account">${tenant.accountId}</dd>
        <dt>Description</dt><dd id="tenant-description">${tenant.description || "–"}</dd>
        <dt>Created</dt><dd>${time(tenant.createTime)}</dd>
        <dt>Changed</dt><dd>${time(tenant.updateTime)}</dd>
      </dl>
    </div>
    <h3>Usage against quota</h3>
    <table class="facts" id="tenant-usage">
      <tbody>
        <tr data-usage="queues"><th>Queues</th><td>${usageText(usage.queues, quota.maxQueues, "queues")}</td></tr>
        <tr data-usage="topics"><th>Topics</th><td>${usageText(usage.topics, quota.maxTopics, "topics")}</td></tr>
        <tr data-usage="messages"><th>Messages</th><td>${usageText(usage.messages, quota.maxMessages, "messages")}</td></tr>
        <tr data-usage="bytes"><th>Body bytes</th><td>${usageText(usage.bytes, quota.maxBytes, "bytes")}</td></tr>
      </tbody>
    </table>
    <p class="muted">Counted ${time(usage.countTime)}; sends are checked against these figures.</p>
    <h3>Rate limits</h3>
    <table class="facts" id="tenant-limits">
      <tbody>
        <tr data-limit="sends"><th>Sends</th><td>${limitText(limits.sendsPerSecond, limits.sendBurst)}</td></tr>
        <tr data-limit="receives"><th>Receives</th><td>${limitText(limits.receivesPerSecond, limits.receiveBurst)}</td></tr>
        <tr data-limit="calls"><th>Calls</th><td>${limitText(limits.callsPerSecond, limits.callBurst)}</td></tr>
      </tbody>
    </table>` : null}
  </section>`;
}
