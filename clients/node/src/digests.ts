// Verifying a transcript: recompute a conversation's digest chain from its entries and
// appends and compare it with the head digest (docs/transcript.md defines the encoding):
//
//   digest(v) = SHA-256(digest(v - 1) || canonical(v)),  digest(0) = 32 zero bytes
//
// The client recomputes it itself, trusting nothing of the server but what it reads.

import { createHash } from "node:crypto";

import type { Entry__Output, Message__Output } from "./gen/runifold/common/v1/common_objects.js";
import type { Append__Output } from "./gen/runifold/transcript/v1/transcript_service_objects.js";

export const GENESIS = new Uint8Array(32);

const ROLES: Record<string, number> = { ROLE_USER: 1, ROLE_ASSISTANT: 2, ROLE_TOOL: 3 };
const UTF8 = new TextEncoder();

/** Bytes as a plain Uint8Array (the generated objects type them as Buffer). */
export function bytesOf(value: ArrayLike<number> | null | undefined): Uint8Array {
  return Uint8Array.from(value ?? []);
}

export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

function int(value: number | bigint): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigInt64(0, BigInt(value));
  return out;
}

function str(value: string): Uint8Array[] {
  const encoded = UTF8.encode(value ?? "");
  return [int(encoded.length), encoded];
}

function utf8Order(a: string, b: string): number {
  const x = UTF8.encode(a);
  const y = UTF8.encode(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

/** The canonical bytes of one entry's message. */
export function messageBytes(message: Message__Output): Uint8Array {
  const parts: Uint8Array[] = [int(ROLES[String(message.role)] ?? 0), ...str(message.text)];
  const calls = message.tool_calls ?? [];
  parts.push(int(calls.length));
  for (const call of calls) parts.push(...str(call.id), ...str(call.name), ...str(call.arguments_json));
  parts.push(...str(message.tool_call_id));
  const items = Object.entries(message.metadata ?? {}).sort(([a], [b]) => utf8Order(a, b));
  parts.push(int(items.length));
  for (const [key, value] of items) parts.push(...str(key), ...str(value));
  parts.push(...str(message.native_json));
  return concat(parts);
}

/** digest(v) of an append from the digest before it and its entries' messages. */
export function appendDigest(
  previous: Uint8Array,
  append: Append__Output,
  messages: Message__Output[],
): Uint8Array {
  const time = append.commit_time ?? { seconds: 0, nanos: 0 };
  const micros = BigInt(time.seconds) * 1_000_000n + BigInt(Math.floor(time.nanos / 1000));
  const retracted = [...append.retracted_sequences].sort((a, b) => a - b);
  const hash = createHash("sha256");
  hash.update(previous);
  hash.update(int(append.version));
  hash.update(int(append.first_sequence));
  hash.update(int(append.last_sequence));
  hash.update(int(micros));
  hash.update(int(retracted.length));
  for (const sequence of retracted) hash.update(int(sequence));
  for (const message of messages) hash.update(messageBytes(message));
  return Uint8Array.from(hash.digest());
}

/** The transcript does not match its digests: which append, and why. */
export class VerificationFailed extends Error {
  constructor(
    readonly version: number,
    readonly why: string,
  ) {
    super(`version ${version}: ${why}`);
    this.name = "VerificationFailed";
  }
}

/** A transcript whose every digested append was recomputed and matched. */
export interface Verified {
  headDigest: Uint8Array;
  appends: number;
  entries: number;
}

/**
 * Recompute the chain of `appends` (in version order, from version 1) over `entries` (by
 * sequence) and compare its end with `headDigest`, or, when it is a head you `held` from
 * before, find it on the chain; VerificationFailed otherwise.
 */
export function recompute(
  appends: Append__Output[],
  entries: Map<number, Entry__Output>,
  headDigest: Uint8Array,
  held = false,
): Verified {
  const seen = new Set<string>();
  let previous: Uint8Array = GENESIS;
  let expected = 1;
  let checked = 0;
  let covered = 0;
  let lastVersion = 0;
  for (const append of appends) {
    if (append.version !== expected) throw new VerificationFailed(expected, "an append is missing");
    expected += 1;
    lastVersion = append.version;
    covered += append.last_sequence - append.first_sequence + 1;
    const recorded = bytesOf(append.digest);
    if (recorded.length === 0) {
      previous = GENESIS;
      continue;
    }
    if (!equalBytes(bytesOf(append.previous_digest), previous)) {
      throw new VerificationFailed(append.version, "it does not follow the previous digest");
    }
    const messages: Message__Output[] = [];
    for (let s = append.first_sequence; s <= append.last_sequence; s++) {
      const entry = entries.get(s);
      if (!entry?.message) throw new VerificationFailed(append.version, `entry ${s} is missing`);
      messages.push(entry.message);
    }
    const digest = appendDigest(previous, append, messages);
    if (!equalBytes(digest, recorded)) {
      throw new VerificationFailed(append.version, "its entries, retractions or commit time changed");
    }
    previous = digest;
    seen.add(hex(digest));
    checked += 1;
  }
  if (covered !== entries.size) throw new VerificationFailed(lastVersion, "entries beyond the appends");
  if (held && !seen.has(hex(headDigest))) {
    throw new VerificationFailed(lastVersion, "the head digest you hold is not on the chain");
  }
  if (!held && checked && !equalBytes(previous, headDigest)) {
    throw new VerificationFailed(lastVersion, "the chain does not end at the head digest");
  }
  return { headDigest: checked ? previous : new Uint8Array(0), appends: checked, entries: entries.size };
}
