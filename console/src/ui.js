import htm from "htm";
import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { errorText } from "./api.js";

export const html = htm.bind(h);

// How often live views ask again (milliseconds).
export const POLL_INTERVAL = 3000;

// Runs `load` now and again POLL_INTERVAL after each answer (never two at once), until
// the view goes; `deps` restart it.
export function usePoll(load, deps) {
  const [state, setState] = useState({ data: null, error: null });
  const reload = useRef(() => {});
  useEffect(() => {
    let stopped = false;
    let timer = null;
    const run = async () => {
      clearTimeout(timer);
      try {
        const data = await load();
        if (!stopped) setState({ data, error: null });
      } catch (error) {
        if (!stopped) setState((old) => ({ data: old.data, error: errorText(error) }));
      }
      if (!stopped) timer = setTimeout(run, POLL_INTERVAL);
    };
    reload.current = run;
    run();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, deps);
  return [state.data, state.error, () => reload.current()];
}

// An action's button state: runs `action`, shows its error, disables while it runs.
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const run = async (action) => {
    setBusy(true);
    setError(null);
    try {
      return await action();
    } catch (failure) {
      setError(errorText(failure));
      return undefined;
    } finally {
      setBusy(false);
    }
  };
  return { busy, error, run };
}

export function ErrorLine({ error }) {
  return error ? html`<p class="error" role="alert">${error}</p>` : null;
}

// The last values as a line, scaled to their own maximum.
export function Sparkline({ values, width = 80, height = 18 }) {
  if (!values || values.length < 2) return html`<svg class="spark" width=${width} height=${height}></svg>`;
  const max = Math.max(...values, 1e-9);
  const step = width / (values.length - 1);
  const points = values
    .map((value, i) => `${(i * step).toFixed(1)},${(height - 1 - (value / max) * (height - 2)).toFixed(1)}`)
    .join(" ");
  return html`<svg class="spark" width=${width} height=${height} viewBox="0 0 ${width} ${height}">
    <polyline points=${points} fill="none" />
  </svg>`;
}
