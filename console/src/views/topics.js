import { WebhookDeliveryState } from "../../../stubs/ts/gen/postbox/v1/topic_service_pb.js";
import { listAll, streams, topics } from "../api.js";
import { age, count, time } from "../format.js";
import { ErrorLine, html, useAction, usePoll } from "../ui.js";

export function TopicList() {
  const [found, error] = usePoll(() => listAll(topics.listTopics, {}, "topics"), []);
  return html`<section>
    <h2>Topics</h2>
    <${ErrorLine} error=${error} />
    <ul class="list" id="topics">
      ${(found ?? []).map((topic) => html`<li key=${topic.name} data-topic=${topic.name}>
        <a href=${`#/topics/${encodeURIComponent(topic.name)}`}>${topic.name}</a>
        ${topic.streamRetention ? html` <span class="tag">stream</span>` : null}
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

// A stream topic's consumer groups with their cursor and lag, asked again at every poll.
function ConsumerGroups({ groups }) {
  if (groups.length === 0) return html`<p class="muted">No consumer groups.</p>`;
  return html`<table id="consumer-groups">
    <thead><tr><th>Group</th><th class="num">Cursor offset</th><th class="num">Lag (messages)</th>
      <th class="num">Lag (time)</th><th>Last ack</th><th>Batch out until</th></tr></thead>
    <tbody>${groups.map((group) => html`<tr key=${group.name} data-group=${group.name}>
      <td>${group.name}</td>
      <td class="num cursor">${count(group.cursorOffset)}</td>
      <td class="num lag-messages">${count(group.lagMessages)}</td>
      <td class="num lag-time">${age(group.lag)}</td>
      <td>${time(group.ackTime)}</td>
      <td>${time(group.leaseExpireTime)}</td>
    </tr>`)}</tbody>
  </table>`;
}

export function TopicDetail({ name, access }) {
  // One poll for both, so the groups are as fresh as the subscriptions.
  const [found, error] = usePoll(async () => {
    const { topic } = await topics.getTopic({ name });
    const [subscriptions, groups] = await Promise.all([
      listAll(topics.listSubscriptions, { topic: name }, "subscriptions", 100),
      topic?.streamRetention
        ? listAll(streams.listConsumerGroups, { topic: name }, "consumerGroups", 1000)
        : null,
    ]);
    return { subscriptions, groups };
  }, [name]);
  const subscriptions = found?.subscriptions;
  const groups = found?.groups;
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
    ${groups ? html`<section class="card" id="stream">
      <h3>Consumer groups <span class="tag">stream</span></h3>
      <${ConsumerGroups} groups=${groups} />
    </section>` : null}
  </section>`;
}
