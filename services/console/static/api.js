// The console's only way to the data: the services' own RPCs over Connect with JSON
// (POST /<package>.<Service>/<Method>), with the user's own credentials. The console can
// therefore do exactly what its user may do, and nothing else.

export const TRANSCRIPT = "runifold.transcript.v1.TranscriptService";
export const SUMMARY = "runifold.summary.v1.SummaryService";
export const MEMORY = "runifold.memory.v1.MemoryService";
export const AGENT = "runifold.agent.v1.AgentService";

const TOKEN_KEY = "runifold.console.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra) {
  const h = { ...extra };
  const t = token();
  if (t) h["authorization"] = `Bearer ${t}`;
  return h;
}

// A failed call: the Connect code, the message, and the ErrorInfo reason and metadata
// (read from the detail's `debug` form, which the server sends with each detail).
export class RpcError extends Error {
  constructor(code, message, reason, metadata) {
    super(message);
    this.code = code;
    this.reason = reason || "";
    this.metadata = metadata || {};
  }

  describe() {
    return this.reason ? `${this.code} / ${this.reason}: ${this.message}` : `${this.code}: ${this.message}`;
  }
}

function errorOf(status, body) {
  if (body && typeof body === "object" && typeof body.code === "string") {
    const info = (body.details || []).find((d) => d.type === "google.rpc.ErrorInfo");
    const debug = (info && info.debug) || {};
    return new RpcError(body.code, body.message || "", debug.reason, debug.metadata);
  }
  return new RpcError("unknown", `HTTP ${status}`);
}

export async function call(service, method, request, { timeoutMs = 30000 } = {}) {
  let response;
  try {
    response = await fetch(`${service}/${method}`, {
      method: "POST",
      headers: headers({
        "content-type": "application/json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": String(timeoutMs),
      }),
      body: JSON.stringify(request),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (e) {
    throw new RpcError("unavailable", "the server cannot be reached");
  }
  return (await bodyOf(response)) || {};
}

export async function getJson(path) {
  const response = await fetch(path, { headers: headers({}), credentials: "omit", cache: "no-store" });
  return bodyOf(response);
}

// A response's JSON body (null when it has none); an error status throws its RpcError.
async function bodyOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    body = null;
  }
  if (!response.ok) throw errorOf(response.status, body);
  return body;
}

// proto3 JSON writes int64 as strings; the console counts with numbers.
export function int(value) {
  if (value === undefined || value === null || value === "") return 0;
  return Number(value);
}

// A server stream over Connect (application/connect+json): the request in one envelope
// (a flags byte, a 4-byte big-endian length, the JSON), then each message handed to
// `onMessage` as its envelope arrives, until the end-of-stream envelope (flag 2), whose
// `error`, if any, is thrown as an RpcError.
export async function stream(service, method, request, onMessage, { timeoutMs = 120000 } = {}) {
  const json = new TextEncoder().encode(JSON.stringify(request));
  const body = new Uint8Array(5 + json.length);
  new DataView(body.buffer).setUint32(1, json.length);
  body.set(json, 5);
  let response;
  try {
    response = await fetch(`${service}/${method}`, {
      method: "POST",
      headers: headers({
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": String(timeoutMs),
      }),
      body,
      credentials: "omit",
      cache: "no-store",
    });
  } catch (e) {
    throw new RpcError("unavailable", "the server cannot be reached");
  }
  if (!response.ok) {
    await bodyOf(response);
    throw new RpcError("unknown", `HTTP ${response.status}`);
  }
  const reader = response.body.getReader();
  const text = new TextDecoder();
  let buffer = new Uint8Array(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (value) {
      const joined = new Uint8Array(buffer.length + value.length);
      joined.set(buffer);
      joined.set(value, buffer.length);
      buffer = joined;
    }
    while (buffer.length >= 5) {
      const flags = buffer[0];
      const length = new DataView(buffer.buffer, buffer.byteOffset, buffer.length).getUint32(1);
      if (buffer.length < 5 + length) break;
      const message = JSON.parse(text.decode(buffer.subarray(5, 5 + length)));
      buffer = buffer.slice(5 + length);
      if (flags & 2) {
        if (message.error) throw errorOf(0, message.error);
        return;
      }
      onMessage(message);
    }
    if (done) throw new RpcError("unavailable", "the stream ended before its end");
  }
}

// An id for a turn sent from the console (getRandomValues: also on a plain-HTTP origin).
export function turnId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
