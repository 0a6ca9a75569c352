import { useState } from "preact/hooks";
import { listAll, schedules } from "../api.js";
import { seconds, time } from "../format.js";
import { ErrorLine, html, useAction, usePoll } from "../ui.js";

function timing(schedule) {
  const { case: kind, value } = schedule.timing;
  if (kind === "cron") return `cron ${value.expression}${value.timeZone ? ` (${value.timeZone})` : ""}`;
  if (kind === "interval") return `every ${seconds(value)} s`;
  if (kind === "runAt") return `once at ${time(value)}`;
  return "–";
}

function target(schedule) {
  const { case: kind, value } = schedule.target?.destination ?? {};
  return kind ? `${kind} ${value}` : "–";
}

function Row({ schedule, canManage, onChanged }) {
  const action = useAction();
  const [preview, setPreview] = useState(null);
  const run = (call) => action.run(async () => { await call(); onChanged(); });
  const showPreview = () =>
    action.run(async () => {
      const response = await schedules.previewSchedule({ schedule, count: 5 });
      setPreview(response.fireTimes);
    });
  return html`<tr data-schedule=${schedule.name}>
    <td>${schedule.name}</td>
    <td>${timing(schedule)}</td>
    <td>${target(schedule)}</td>
    <td>${schedule.paused ? html`<span class="tag warn">paused</span>` : time(schedule.nextFireTime)}
      ${preview ? html`<ul class="fire-times">${preview.map((t) => html`<li>${time(t)}</li>`)}</ul>` : null}</td>
    <td>${time(schedule.lastFireTime)} ${schedule.lastError ? html`<span class="error">${schedule.lastError}</span>` : null}</td>
    <td class="num">${String(schedule.fireCount)}</td>
    <td class="buttons">
      <button type="button" disabled=${action.busy} onClick=${showPreview}>Next 5</button>
      ${canManage ? html`
        <button type="button" disabled=${action.busy}
          onClick=${() => run(() => schedules.runSchedule({ name: schedule.name }))}>Run now</button>
        ${schedule.paused
          ? html`<button type="button" disabled=${action.busy}
              onClick=${() => run(() => schedules.resumeSchedule({ name: schedule.name }))}>Resume</button>`
          : html`<button type="button" disabled=${action.busy}
              onClick=${() => run(() => schedules.pauseSchedule({ name: schedule.name }))}>Pause</button>`}` : null}
      <${ErrorLine} error=${action.error} />
    </td>
  </tr>`;
}

export function Schedules({ access }) {
  const [found, error, reload] = usePoll(() => listAll(schedules.listSchedules, {}, "schedules"), []);
  return html`<section>
    <h2>Schedules</h2>
    <${ErrorLine} error=${error} />
    <table>
      <thead><tr><th>Name</th><th>Timing</th><th>Target</th><th>Next fire</th><th>Last fire</th>
        <th class="num">Fired</th><th></th></tr></thead>
      <tbody>${(found ?? []).map((schedule) => html`<${Row} key=${schedule.name} schedule=${schedule}
        canManage=${access.can("manage", schedule.name)} onChanged=${reload} />`)}</tbody>
    </table>
    ${found && found.length === 0 ? html`<p class="muted">No schedules.</p>` : null}
  </section>`;
}
