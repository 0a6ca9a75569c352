import { WebhookDeliveryState } from "../../../stubs/ts/gen/postbox/v1/topic_service_pb.js";
import { listAll, topics } from "../api.js";
import { time } from "../format.js";
import { ErrorLine, html, useAction, usePoll } from "../ui.js";

export function TopicList() {
  const [found, error] = usePoll(() => listAll(topics.listTopics, {}, "topics"), []);
  return html`<section>
    <h2>Topics</h2>
    <${ErrorLine} error=${error} />
    <ul class="list" id="topics">
      ${(found ?? []).map((topic) => html`<li key=${topic.name} data-topic=${topic.name}>
        <a href=${`#/topics/${encodeURIComponent(topic.name)}`}>${topic.name}</a>
        <span class="muted"> created ${time(topic.createTime)}</span></li>`)}
    </ul>
    ${found && found.length === 0 ? html`<p class="muted">No topics.</p>` : null}
  </section>`;
}

function destination(subscription) {
  const { case: kind, value } = subscription.destination;
  if (kind === "queue") return html`queue <a href=${`#/queues/${encodeURIComponent(value)}`}>${value}</a>`;
  if (kind === "webhook") return html`webhook <span class="mono">${value.url}</span>`;
  return "–";
}

function Deliveries({ topic, subscription, canManage }) {
  const action = useAction();
  const [deliveries, error, reload] = usePoll(
    async () =>
      (await topics.listWebhookDeliveries({ topic, subscription, pageSize: 100 })).deliveries,
    [topic, subscription],
  );
  const retry = (delivery) =>
    action.run(async () => {
      await topics.retryWebhookDelivery({ topic, subscription, deliveryId: delivery.deliveryId });
      reload();
    });
  return html`<div class="deliveries">
    <${ErrorLine} error=${action.error || error} />
    ${deliveries && deliveries.length === 0 ? html`<p class="muted">No deliveries pending or failed.</p>` : null}
    ${deliveries && deliveries.length ? html`<table>
      <thead><tr><th>Delivery</th><th>State</th><th class="num">Attempts</th><th>Last attempt</th>
        <th>Status</th><th>Next attempt</th><th></th></tr></thead>
      <tbody>${deliveries.map((delivery) => html`<tr key=${delivery.deliveryId} data-delivery=${delivery.deliveryId}>
        <td class="mono">${delivery.deliveryId}</td>
        <td class="state">${WebhookDeliveryState[delivery.state]}</td>
        <td class="num">${delivery.attempts}</td>
        <td>${time(delivery.lastAttemptTime)}</td>
        <td>${delivery.lastStatusCode ?? ""} ${delivery.lastError}</td>
        <td>${time(delivery.nextAttemptTime)}</td>
        <td>${canManage && delivery.state === WebhookDeliveryState.FAILED
          ? html`<button type="button" class="retry" disabled=${action.busy} onClick=${() => retry(delivery)}>Retry</button>`
          : null}</td>
      </tr>`)}</tbody>
    </table>` : null}
  </div>`;
}

export function TopicDetail({ name, access }) {
  const [subscriptions, error] = usePoll(
    () => listAll(topics.listSubscriptions, { topic: name }, "subscriptions", 100),
    [name],
  );
  const canManage = access.can("manage", name);
  return html`<section>
    <p><a href="#/topics">← Topics</a></p>
    <h2>${name}</h2>
    <${ErrorLine} error=${error} />
    ${(subscriptions ?? []).map((subscription) => html`<section class="card" key=${subscription.name}
        data-subscription=${subscription.name}>
      <h3>${subscription.name} ${subscription.suspended ? html`<span class="tag warn">suspended</span>` : null}</h3>
      <p>→ ${destination(subscription)} ${subscription.pattern ? html`<span class="muted">pattern ${subscription.pattern}</span>` : null}</p>
      ${subscription.destination.case === "webhook"
        ? html`<${Deliveries} topic=${name} subscription=${subscription.name} canManage=${canManage} />`
        : null}
    </section>`)}
    ${subscriptions && subscriptions.length === 0 ? html`<p class="muted">No subscriptions.</p>` : null}
  </section>`;
}
