import { useState } from "preact/hooks";
import { MessageState } from "../../../stubs/ts/gen/postbox/v1/message_pb.js";
import { QueueView, RedriveTask_State } from "../../../stubs/ts/gen/postbox/v1/queue_service_pb.js";
import { listAll, messages, queues } from "../api.js";
import { age, bodyText, count, rate, seconds, time } from "../format.js";
import { ErrorLine, html, useAction, usePoll } from "../ui.js";
import { Holder, MessageList, messageHref } from "./jobs.js";

const encoder = new TextEncoder();

// The attributes the form edits: the update_mask path, how it reads and writes.
const duration = (value) => ({ seconds: BigInt(Math.round(Number(value))), nanos: 0 });
const ATTRIBUTES = [
  { path: "visibility_timeout", label: "Visibility timeout (s)",
    read: (q) => seconds(q.visibilityTimeout), write: (v) => ({ visibilityTimeout: duration(v) }) },
  { path: "delivery_delay", label: "Delivery delay (s)",
    read: (q) => seconds(q.deliveryDelay), write: (v) => ({ deliveryDelay: duration(v) }) },
  { path: "receive_wait_time", label: "Receive wait time (s)",
    read: (q) => seconds(q.receiveWaitTime), write: (v) => ({ receiveWaitTime: duration(v) }) },
  { path: "retention", label: "Retention (s)",
    read: (q) => seconds(q.retention?.period), write: (v) => ({ retention: { period: duration(v) } }) },
  { path: "max_message_size", label: "Max message size (bytes)",
    read: (q) => q.maxMessageSize, write: (v) => ({ maxMessageSize: Number(v) }) },
  { path: "max_depth", label: "Max depth (empty: none)",
    read: (q) => (q.maxDepth === undefined ? "" : String(q.maxDepth)),
    write: (v) => (v === "" ? {} : { maxDepth: BigInt(v) }) },
  { path: "receive_rate_limit", label: "Receive rate limit /s (empty: none)",
    read: (q) => (q.receiveRateLimit === undefined ? "" : String(q.receiveRateLimit)),
    write: (v) => (v === "" ? {} : { receiveRateLimit: Number(v) }) },
  { path: "dead_letter_policy", label: "Dead-letter queue (empty: none)",
    read: (q) => q.deadLetterPolicy?.deadLetterQueue ?? "",
    write: (v, q, form) => (v === "" ? {} : { deadLetterPolicy: {
      deadLetterQueue: v, maxReceiveCount: Number(form.max_receive_count || q.deadLetterPolicy?.maxReceiveCount || 5) } }) },
  { path: "max_receive_count", mask: "dead_letter_policy", label: "Max receive count",
    read: (q) => q.deadLetterPolicy?.maxReceiveCount ?? "",
    write: (v, q, form) => ({ deadLetterPolicy: {
      deadLetterQueue: form.dead_letter_policy ?? q.deadLetterPolicy?.deadLetterQueue ?? "", maxReceiveCount: Number(v) } }) },
];

function Attributes({ queue, canManage, onSaved }) {
  const [edits, setEdits] = useState({});
  const action = useAction();
  const changed = Object.keys(edits).filter((path) => {
    const attribute = ATTRIBUTES.find((a) => a.path === path);
    return String(attribute.read(queue)) !== edits[path];
  });
  const save = () =>
    action.run(async () => {
      let update = { name: queue.name };
      const mask = new Set();
      for (const path of changed) {
        const attribute = ATTRIBUTES.find((a) => a.path === path);
        update = { ...update, ...attribute.write(edits[path], queue, edits) };
        mask.add(attribute.mask ?? attribute.path);
      }
      await queues.updateQueue({ queue: update, updateMask: { paths: [...mask] } });
      setEdits({});
      onSaved();
    });
  return html`<section class="card" id="attributes">
    <h3>Attributes</h3>
    <form class="attributes" onSubmit=${(event) => { event.preventDefault(); save(); }}>
      ${ATTRIBUTES.map((attribute) => html`<label>
        <span>${attribute.label}</span>
        <input name=${attribute.path} disabled=${!canManage}
          value=${edits[attribute.path] ?? String(attribute.read(queue))}
          onInput=${(event) => {
            // An updater, not the rendered `edits`: two fields typed into before the
            // next render would otherwise keep only the last one.
            const value = event.currentTarget.value;
            setEdits((current) => ({ ...current, [attribute.path]: value }));
          }} />
      </label>`)}
      <div class="fixed"><span>FIFO</span> ${queue.fifo ? "yes" : "no"}</div>
      <div class="fixed"><span>Created</span> ${time(queue.createTime)}</div>
      ${canManage ? html`<div class="buttons">
        <button type="submit" id="save-attributes" disabled=${action.busy || changed.length === 0}>Save</button>
        <button type="button" disabled=${changed.length === 0} onClick=${() => setEdits({})}>Discard</button>
      </div>` : null}
    </form>
    <${ErrorLine} error=${action.error} />
  </section>`;
}

const STATES = [
  ["All", MessageState.UNSPECIFIED],
  ["Visible", MessageState.VISIBLE],
  ["In flight", MessageState.IN_FLIGHT],
  ["Delayed", MessageState.DELAYED],
  ["Dead", MessageState.DEAD],
];

function Peek({ name, version }) {
  const [state, setState] = useState(MessageState.UNSPECIFIED);
  const [asJson, setAsJson] = useState(false);
  const [open, setOpen] = useState(null);
  const [found, error, reload] = usePoll(
    async () => (await messages.peekMessages({ queue: name, state, pageSize: 50 })).messages,
    [name, state, version],
  );
  return html`<section class="card" id="peek">
    <div class="toolbar">
      <h3>Messages</h3>
      <select value=${state} onChange=${(event) => setState(Number(event.currentTarget.value))}>
        ${STATES.map(([label, value]) => html`<option value=${value}>${label}</option>`)}
      </select>
      <label class="check"><input type="checkbox" id="as-json" checked=${asJson}
        onChange=${(event) => setAsJson(event.currentTarget.checked)} /> Body as JSON</label>
      <button type="button" onClick=${reload}>Refresh</button>
    </div>
    <${ErrorLine} error=${error} />
    <table class="messages">
      <thead><tr><th>Id</th><th>State</th><th>Enqueued</th><th class="num">Receives</th><th>Consumer</th><th>Body</th></tr></thead>
      <tbody>
        ${(found ?? []).map((message) => html`<tr key=${message.messageId} data-message=${message.messageId}
            onClick=${() => setOpen(open === message.messageId ? null : message.messageId)}>
          <td class="mono"><a href=${messageHref(name, message.messageId)}
            onClick=${(event) => event.stopPropagation()}>${message.messageId}</a></td>
          <td>${MessageState[message.state] ?? ""}</td>
          <td>${time(message.enqueueTime)}</td>
          <td class="num">${message.receiveCount}</td>
          <td class="consumer"><${Holder} message=${message} /></td>
          <td><pre class="body">${bodyText(message.body, asJson)}</pre>
            ${open === message.messageId || Object.keys(message.attributes).length
              ? html`<dl class="message-attributes">
                  ${Object.entries(message.attributes).map(([key, value]) => html`
                    <dt>${key}</dt><dd>${value.value.case === "stringValue" ? value.value.value : `(${value.dataType}, binary)`}</dd>`)}
                  ${message.lastError ? html`<dt>last error</dt><dd>${message.lastError}</dd>` : null}
                  ${message.deadLetterSourceQueue ? html`<dt>from</dt><dd>${message.deadLetterSourceQueue}</dd>` : null}
                </dl>`
              : null}</td>
        </tr>`)}
      </tbody>
    </table>
    ${found && found.length === 0 ? html`<p class="muted" id="no-messages">No messages.</p>` : null}
  </section>`;
}

function SendTest({ name, onSent }) {
  const [body, setBody] = useState('{"hello": "postbox"}');
  const [attributes, setAttributes] = useState("");
  const [sent, setSent] = useState(null);
  const action = useAction();
  const send = () =>
    action.run(async () => {
      const parsed = {};
      for (const line of attributes.split("\n")) {
        if (!line.trim()) continue;
        const at = line.indexOf("=");
        if (at < 1) throw new Error(`an attribute line reads name=value: ${line}`);
        parsed[line.slice(0, at).trim()] = {
          dataType: "String",
          value: { case: "stringValue", value: line.slice(at + 1) },
        };
      }
      const response = await messages.send({ queue: name, body: encoder.encode(body), attributes: parsed });
      setSent(response.messageId);
      onSent();
    });
  return html`<section class="card" id="send">
    <h3>Send a test message</h3>
    <textarea id="send-body" rows="3" value=${body} onInput=${(e) => setBody(e.currentTarget.value)}></textarea>
    <textarea id="send-attributes" rows="2" placeholder="attributes, one name=value a line"
      value=${attributes} onInput=${(e) => setAttributes(e.currentTarget.value)}></textarea>
    <button type="button" id="send-button" disabled=${action.busy} onClick=${send}>Send</button>
    ${sent ? html`<span class="muted" id="sent-id"> sent ${sent}</span>` : null}
    <${ErrorLine} error=${action.error} />
  </section>`;
}

function Redrive({ name, sources, canManage }) {
  const action = useAction();
  const [tasks, error, reload] = usePoll(
    () => listAll(queues.listRedriveTasks, { deadLetterQueue: name }, "tasks", 100),
    [name],
  );
  const start = () =>
    action.run(async () => {
      await queues.redriveMessages({ deadLetterQueue: name });
      reload();
    });
  return html`<section class="card" id="redrive">
    <h3>Dead letters of</h3>
    <ul class="sources">
      ${sources.map((source) => html`<li><a href=${`#/queues/${encodeURIComponent(source)}`}>${source}</a></li>`)}
    </ul>
    ${canManage ? html`<button type="button" id="redrive-button" disabled=${action.busy} onClick=${start}>
      Redrive to their source queues</button>` : null}
    <${ErrorLine} error=${action.error || error} />
    ${(tasks ?? []).slice(0, 10).map((task) => {
      const total = Number(task.messagesToMove);
      const moved = Number(task.movedMessages);
      return html`<div class="task" key=${task.taskId}>
        <span>${RedriveTask_State[task.state]}</span>
        <progress max=${total || 1} value=${moved}></progress>
        <span>${count(moved)} / ${count(total)}</span>
        <span class="muted">${time(task.createTime)}</span>
        ${task.failureReason ? html`<span class="error">${task.failureReason}</span>` : null}
        ${canManage && task.state === RedriveTask_State.RUNNING
          ? html`<button type="button" onClick=${() => action.run(() => queues.cancelRedriveTask({ taskId: task.taskId }))}>Cancel</button>`
          : null}
      </div>`;
    })}
  </section>`;
}

function Actions({ queue, onChanged }) {
  const [confirming, setConfirming] = useState(false);
  const [purged, setPurged] = useState(null);
  const action = useAction();
  const run = (call) => action.run(async () => { await call(); onChanged(); });
  const paused = queue.sendPaused || queue.receivePaused;
  return html`<div class="actions">
    ${!queue.sendPaused ? html`<button type="button" id="pause-sends" disabled=${action.busy}
      onClick=${() => run(() => queues.pauseQueue({ name: queue.name, sends: true }))}>Pause sends</button>` : null}
    ${!queue.receivePaused ? html`<button type="button" id="pause-receives" disabled=${action.busy}
      onClick=${() => run(() => queues.pauseQueue({ name: queue.name, receives: true }))}>Pause receives</button>` : null}
    ${paused ? html`<button type="button" id="resume" disabled=${action.busy}
      onClick=${() => run(() => queues.resumeQueue({ name: queue.name, sends: true, receives: true }))}>Resume</button>` : null}
    ${confirming
      ? html`<span class="confirm" role="alertdialog">
          Purge every message of <b>${queue.name}</b>? This cannot be undone.
          <button type="button" class="danger" id="purge-confirm" disabled=${action.busy}
            onClick=${() => run(async () => {
              const response = await queues.purgeQueue({ name: queue.name });
              setPurged(Number(response.purgedMessages));
              setConfirming(false);
            })}>Purge</button>
          <button type="button" id="purge-cancel" onClick=${() => setConfirming(false)}>Cancel</button>
        </span>`
      : html`<button type="button" class="danger" id="purge" onClick=${() => { setPurged(null); setConfirming(true); }}>Purge…</button>`}
    ${purged !== null ? html`<span class="muted" id="purged">purged ${count(purged)} messages</span>` : null}
    <${ErrorLine} error=${action.error} />
  </div>`;
}

export function QueueDetail({ name, access }) {
  // Bumped by every change made here, so the message list reloads at once.
  const [version, setVersion] = useState(0);
  const changed = () => setVersion((v) => v + 1);
  const [queue, error, reload] = usePoll(
    async () => (await queues.getQueue({ name, view: QueueView.FULL })).queue,
    [name, version],
  );
  const [sources] = usePoll(
    () => listAll(queues.listDeadLetterSourceQueues, { deadLetterQueue: name }, "queueNames", 100),
    [name],
  );
  const canManage = access.can("manage", name);
  const stats = queue?.stats ?? {};
  return html`<section>
    <p><a href="#/">← Queues</a></p>
    <h2 id="queue-name">${name}
      ${queue?.sendPaused ? html` <span class="tag warn">sends paused</span>` : null}
      ${queue?.receivePaused ? html` <span class="tag warn">receives paused</span>` : null}</h2>
    <${ErrorLine} error=${error} />
    ${queue ? html`
      <div class="stats">
        <div><b id="stat-visible">${count(stats.visibleMessages)}</b> visible</div>
        <div><b id="stat-in-flight">${count(stats.inFlightMessages)}</b> in flight</div>
        <div><b id="stat-delayed">${count(stats.delayedMessages)}</b> delayed</div>
        <div><b>${age(stats.oldestMessageAge)}</b> oldest</div>
        <div><b>${rate(stats.sentPerSecond)}</b> sent/s</div>
        <div><b>${rate(stats.receivedPerSecond)}</b> received/s</div>
        ${queue.deadLetterPolicy?.deadLetterQueue ? html`<div>DLQ <a
          href=${`#/queues/${encodeURIComponent(queue.deadLetterPolicy.deadLetterQueue)}`}>${queue.deadLetterPolicy.deadLetterQueue}</a></div>` : null}
      </div>
      ${canManage ? html`<${Actions} queue=${queue} onChanged=${changed} />` : null}
      ${sources && sources.length ? html`<${Redrive} name=${name} sources=${sources} canManage=${canManage} />` : null}
      <div class="columns">
        <${Attributes} key=${queue.updateTime?.seconds} queue=${queue} canManage=${canManage} onSaved=${reload} />
        ${access.can("send", name) ? html`<${SendTest} name=${name} onSent=${changed} />` : null}
      </div>
      ${access.can("read", name) ? html`<${Peek} name=${name} version=${version} />
        <${MessageList} name=${name} version=${version} />` : null}
    ` : null}
  </section>`;
}
