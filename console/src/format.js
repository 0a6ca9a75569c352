export function seconds(duration) {
  if (!duration) return 0;
  return Number(duration.seconds) + duration.nanos / 1e9;
}

export function age(duration) {
  const total = seconds(duration);
  if (total <= 0) return "–";
  if (total < 60) return `${total.toFixed(0)} s`;
  if (total < 3600) return `${(total / 60).toFixed(0)} min`;
  if (total < 86400) return `${(total / 3600).toFixed(1)} h`;
  return `${(total / 86400).toFixed(1)} d`;
}

export function rate(value) {
  if (!value) return "0";
  return value < 10 ? value.toFixed(1) : value.toFixed(0);
}

export function count(value) {
  return Number(value ?? 0).toLocaleString("en-US");
}

export function time(timestamp) {
  if (!timestamp) return "–";
  const date = new Date(Number(timestamp.seconds) * 1000 + timestamp.nanos / 1e6);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

const decoder = new TextDecoder("utf-8", { fatal: true });

function base64(bytes) {
  let text = "";
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text);
}

// A body as text, pretty-printed when asked and it is JSON; in base64 when it is not UTF-8.
export function bodyText(bytes, asJson) {
  let text;
  try {
    text = decoder.decode(bytes);
  } catch {
    return `(binary, base64) ${base64(bytes)}`;
  }
  if (!asJson) return text;
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return `(not JSON) ${text}`;
  }
}
