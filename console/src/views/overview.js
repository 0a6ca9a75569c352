import { Component } from "preact";
import { useRef, useState } from "preact/hooks";
import { QueueView } from "../../../stubs/ts/gen/postbox/v1/queue_service_pb.js";
import { listAll, queues } from "../api.js";
import { age, count, rate } from "../format.js";
import { ErrorLine, Sparkline, html, usePoll } from "../ui.js";

// Polls of history the sparklines draw.
const HISTORY = 40;

function depth(queue) {
  const stats = queue.stats;
  return stats ? Number(stats.visibleMessages + stats.inFlightMessages + stats.delayedMessages) : 0;
}

function pausedText(queue) {
  if (queue.sendPaused && queue.receivePaused) return "paused";
  if (queue.sendPaused) return "sends paused";
  if (queue.receivePaused) return "receives paused";
  return "";
}

// What a sparkline draws: a flat line is the same whatever its length, so an idle queue's
// row stops being drawn again once it has two points.
function shape(values) {
  if (values.length < 2) return "";
  return values.every((value) => value === values[0]) ? `flat ${values[0]}` : values.join();
}

// One queue's row, drawn again only when what it shows changed: a poll of 1,000 queues
// redraws the few that moved.
class Row extends Component {
  shouldComponentUpdate(next) {
    return next.signature !== this.props.signature;
  }

  render({ queue, dlq, sent, received }) {
    const stats = queue.stats ?? {};
    const dlqName = queue.deadLetterPolicy?.deadLetterQueue;
    return html`<tr data-queue=${queue.name}>
      <td class="name"><a href=${`#/queues/${encodeURIComponent(queue.name)}`}>${queue.name}</a>
        ${queue.fifo ? html` <span class="tag">FIFO</span>` : null}</td>
      <td class="num visible">${count(stats.visibleMessages)}</td>
      <td class="num in-flight">${count(stats.inFlightMessages)}</td>
      <td class="num delayed">${count(stats.delayedMessages)}</td>
      <td class="num dlq" title=${dlqName ? `${dlqName}, oldest ${age(dlq?.stats?.oldestMessageAge)}` : ""}>${dlqName ? (dlq ? count(depth(dlq)) : "?") : "–"}</td>
      <td class="num oldest">${age(stats.oldestMessageAge)}</td>
      <td class="num sent">${rate(stats.sentPerSecond)}/s</td>
      <td><${Sparkline} values=${sent} /></td>
      <td class="num received">${rate(stats.receivedPerSecond)}/s</td>
      <td><${Sparkline} values=${received} /></td>
      <td class="paused">${pausedText(queue)}</td>
    </tr>`;
  }
}

export function Overview() {
  const [filter, setFilter] = useState("");
  // name -> {sent: [...], received: [...]}, the last HISTORY polls; kept across polls.
  const history = useRef(new Map());
  const [all, error] = usePoll(async () => {
    const found = await listAll(queues.listQueues, { view: QueueView.FULL }, "queues");
    const seen = new Map();
    for (const queue of found) {
      const old = history.current.get(queue.name) ?? { sent: [], received: [] };
      const sent = [...old.sent, queue.stats?.sentPerSecond ?? 0].slice(-HISTORY);
      const received = [...old.received, queue.stats?.receivedPerSecond ?? 0].slice(-HISTORY);
      seen.set(queue.name, { sent, received });
    }
    history.current = seen;
    return found;
  }, []);

  const byName = new Map((all ?? []).map((queue) => [queue.name, queue]));
  const needle = filter.trim().toLowerCase();
  const shown = (all ?? []).filter((queue) => !needle || queue.name.toLowerCase().includes(needle));
  return html`<section>
    <div class="toolbar">
      <h2>Queues</h2>
      <input type="search" id="queue-filter" placeholder="Filter by name" value=${filter}
        onInput=${(event) => setFilter(event.currentTarget.value)} />
      <span class="muted" id="queue-count">${all ? `${shown.length} of ${all.length} queues` : "loading…"}</span>
    </div>
    <${ErrorLine} error=${error} />
    <table class="queues">
      <thead><tr>
        <th>Name</th><th class="num">Visible</th><th class="num">In flight</th>
        <th class="num">Delayed</th><th class="num">DLQ depth</th><th class="num">Oldest</th>
        <th class="num">Sent</th><th></th><th class="num">Received</th><th></th><th>State</th>
      </tr></thead>
      <tbody>
        ${shown.map((queue) => {
          const dlqName = queue.deadLetterPolicy?.deadLetterQueue;
          const dlq = dlqName ? byName.get(dlqName) : undefined;
          const trail = history.current.get(queue.name) ?? { sent: [], received: [] };
          const stats = queue.stats ?? {};
          const signature = [
            stats.visibleMessages, stats.inFlightMessages, stats.delayedMessages,
            stats.oldestMessageAge?.seconds, stats.sentPerSecond, stats.receivedPerSecond,
            dlq ? depth(dlq) : "", queue.sendPaused, queue.receivePaused, shape(trail.sent), shape(trail.received),
          ].join("|");
          return html`<${Row} key=${queue.name} queue=${queue} dlq=${dlq} sent=${trail.sent}
            received=${trail.received} signature=${signature} />`;
        })}
      </tbody>
    </table>
  </section>`;
}
