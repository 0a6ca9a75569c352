// A message's whole life as a job: a queue's messages by state (ListMessages, paged)
// and one message's state, attempts, times, holder, and result or last error (GetMessage).
import { useState } from "preact/hooks";
import { MessageState } from "../../../stubs/ts/gen/postbox/v1/message_pb.js";
import { messages } from "../api.js";
import { bodyText, time } from "../format.js";
import { ErrorLine, html, usePoll } from "../ui.js";

const PAGE_SIZE = 50;

// The states ListMessages filters by, in the order of a job's life.
export const LIFE_STATES = [
  ["All", MessageState.UNSPECIFIED],
  ["Visible", MessageState.VISIBLE],
  ["Delayed", MessageState.DELAYED],
  ["In flight", MessageState.IN_FLIGHT],
  ["Succeeded", MessageState.SUCCEEDED],
  ["Failed", MessageState.FAILED],
  ["Dead-lettered", MessageState.DEAD_LETTERED],
  ["Dead (in this DLQ)", MessageState.DEAD],
  ["Expired", MessageState.EXPIRED],
  ["Cancelled", MessageState.CANCELLED],
];

export const stateName = (state) =>
  (LIFE_STATES.find(([, value]) => value === state)?.[0] ?? MessageState[state] ?? "").toLowerCase();

export const messageHref = (queue, id) =>
  `#/queues/${encodeURIComponent(queue)}/messages/${encodeURIComponent(id)}`;

// Who holds an in-flight message, and since when; empty for any other state.
export function Holder({ message }) {
  if (message.state !== MessageState.IN_FLIGHT) return null;
  return html`<span class="holder">${message.consumerId || "(no consumer id)"}
    <span class="muted"> since ${time(message.receiveTime)}</span></span>`;
}

export function MessageList({ name, version }) {
  const [state, setState] = useState(MessageState.UNSPECIFIED);
  // The tokens of the pages before this one: "" for the first.
  const [tokens, setTokens] = useState([""]);
  const pageToken = tokens[tokens.length - 1];
  const [page, error, reload] = usePoll(
    () => messages.listMessages({ queue: name, state, pageSize: PAGE_SIZE, pageToken }),
    [name, state, pageToken, version],
  );
  const found = page?.messages ?? [];
  return html`<section class="card" id="jobs">
    <div class="toolbar">
      <h3>Messages by state</h3>
      <select id="jobs-state" value=${state}
        onChange=${(event) => { setState(Number(event.currentTarget.value)); setTokens([""]); }}>
        ${LIFE_STATES.map(([label, value]) => html`<option value=${value}>${label}</option>`)}
      </select>
      <button type="button" onClick=${reload}>Refresh</button>
    </div>
    <${ErrorLine} error=${error} />
    <table class="messages">
      <thead><tr><th>Id</th><th>State</th><th class="num">Attempts</th><th>Consumer</th>
        <th>Enqueued</th><th>Finished</th></tr></thead>
      <tbody>
        ${found.map((message) => html`<tr key=${message.messageId} data-job=${message.messageId}>
          <td class="mono"><a href=${messageHref(name, message.messageId)}>${message.messageId}</a></td>
          <td class="state">${stateName(message.state)}</td>
          <td class="num">${message.receiveCount}</td>
          <td><${Holder} message=${message} /></td>
          <td>${time(message.enqueueTime)}</td>
          <td>${time(message.finishTime)}</td>
        </tr>`)}
      </tbody>
    </table>
    ${page && found.length === 0 ? html`<p class="muted" id="no-jobs">No messages in this state.</p>` : null}
    <div class="buttons">
      <button type="button" id="jobs-first" disabled=${tokens.length === 1} onClick=${() => setTokens([""])}>First page</button>
      <button type="button" id="jobs-next" disabled=${!page?.nextPageToken}
        onClick=${() => setTokens((current) => [...current, page.nextPageToken])}>Next page</button>
    </div>
  </section>`;
}

function Field({ id, label, children }) {
  return html`<dt>${label}</dt><dd id=${id}>${children}</dd>`;
}

export function MessageDetail({ queue, id }) {
  const [asJson, setAsJson] = useState(false);
  const [message, error] = usePoll(
    async () => (await messages.getMessage({ queue, messageId: id })).message,
    [queue, id],
  );
  return html`<section>
    <p><a href=${`#/queues/${encodeURIComponent(queue)}`}>← ${queue}</a></p>
    <h2>Message <span class="mono" id="message-id">${id}</span></h2>
    <${ErrorLine} error=${error} />
    ${message ? html`<section class="card" id="message">
      <dl class="message-life">
        <${Field} id="message-state" label="State">${stateName(message.state)}<//>
        <${Field} id="message-attempts" label="Attempts">${message.receiveCount}${
          message.maxReceiveCount ? ` of ${message.maxReceiveCount}` : ""}<//>
        <${Field} id="message-consumer" label="Held by">${
          message.state === MessageState.IN_FLIGHT ? html`<${Holder} message=${message} />` : "–"}<//>
        <${Field} id="message-enqueued" label="Enqueued">${time(message.enqueueTime)}<//>
        <${Field} id="message-visible" label="Visible from">${time(message.visibleTime)}<//>
        <${Field} id="message-first-receive" label="First received">${time(message.firstReceiveTime)}<//>
        <${Field} id="message-receive" label="Last received">${time(message.receiveTime)}<//>
        <${Field} id="message-finished" label="Finished">${time(message.finishTime)}<//>
        <${Field} id="message-expires" label="Expires">${time(message.expireTime)}<//>
        ${message.result.length ? html`<${Field} id="message-result" label="Result">
          <pre class="body">${bodyText(message.result, asJson)}</pre><//>` : null}
        ${message.lastError ? html`<${Field} id="message-error" label="Last error">${message.lastError}<//>` : null}
        ${message.deadLetterSourceQueue ? html`<${Field} id="message-source" label="From">${message.deadLetterSourceQueue}<//>` : null}
        ${message.messageGroupId ? html`<${Field} id="message-group" label="Group">${message.messageGroupId}<//>` : null}
        <${Field} id="message-body" label="Body"><pre class="body">${bodyText(message.body, asJson)}</pre><//>
      </dl>
      <label class="check"><input type="checkbox" id="detail-as-json" checked=${asJson}
        onChange=${(event) => setAsJson(event.currentTarget.checked)} /> Body and result as JSON</label>
    </section>` : null}
  </section>`;
}
