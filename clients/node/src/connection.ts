// What every service's calls share: the channel, the call with its deadline and typed
// errors, the one paging loop of the listings, and the retry policy.
//
// Every RPC of the four services is a method of RunifoldClient (index.ts), composed of
// one class of methods per service (agent.ts, transcript.ts, summary.ts, memory.ts) on
// this connection. The messages are protoc-gen-es's (gen/ts, `buf generate`), on the
// wire through @grpc/grpc-js; the methods take and return plain objects (objects.ts).
//
// What a client is not given it reads from the environment the `runifold` command and
// the Python client read (RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN), so one
// `export` moves every tool.

import * as grpc from "@grpc/grpc-js";
import type { DescMessage, DescMethod, DescService } from "@bufbuild/protobuf";

import { BY_CODE, BY_REASON, RunifoldError, Unavailable, type Detail } from "./errors.js";
import { statusDetails } from "./details.js";
import { decode, encode } from "./objects.js";
import type { WatchPosition } from "./watch.js";

export const DEFAULT_TARGET = "127.0.0.1:50051";
/** What a client reads when it is not given a target, a namespace or a token. */
export const TARGET_ENV = "RUNIFOLD_TARGET";
export const NAMESPACE_ENV = "RUNIFOLD_NAMESPACE";
export const TOKEN_ENV = "RUNIFOLD_TOKEN";
/** Page size of the listing iterators (the servers allow at most 1000). */
export const PAGE_SIZE = 500;

// Calls that spend model calls again when retried (nothing is stored twice either way).
const NOT_RETRIED = new Set([
  "runifold.summary.v1.SummaryService/Summarize",
  "runifold.memory.v1.MemoryService/ProposeMemories",
]);

export interface ClientOptions {
  /** host:port of the server (default: $RUNIFOLD_TARGET, else 127.0.0.1:50051). */
  target?: string;
  /** The default namespace of every call (each method takes `namespace` too; default:
   * $RUNIFOLD_NAMESPACE, else none: the token's). */
  namespace?: string;
  /** A bearer token, sent as `authorization: Bearer ...` (default: $RUNIFOLD_TOKEN; "": none). */
  token?: string;
  /** Channel credentials (default: plaintext, for loopback and development). */
  credentials?: grpc.ChannelCredentials;
  /** Deadline of each call, in milliseconds (default 60 s). */
  timeoutMs?: number;
  /** Attempts in all for a call answered UNAVAILABLE (2..5; 1 turns retries off). */
  maxAttempts?: number;
}

/** Options every call takes. */
export interface CallOptions {
  namespace?: string;
  timeoutMs?: number;
}

/** One method of a service: its path, its messages, and the objects they are. */
export interface Rpc<Request, Response> {
  path: string;
  input: DescMessage;
  output: DescMessage;
  /** Types only: the request and reply objects. */
  readonly objects?: { request: Request; response: Response };
}

/** The methods of a service (protoc-gen-es's descriptor), typed by its `S__Methods`. */
export function rpcs<M extends { [K in keyof M]: { request: unknown; response: unknown } }>(
  service: DescService,
): { [K in keyof M]: Rpc<M[K]["request"], M[K]["response"]> } {
  const found: Record<string, Rpc<unknown, unknown>> = {};
  for (const method of service.methods) {
    found[method.localName] = {
      path: `/${service.typeName}/${method.name}`,
      input: method.input,
      output: method.output,
    };
  }
  return found as { [K in keyof M]: Rpc<M[K]["request"], M[K]["response"]> };
}

export function duration(seconds: number | undefined): { seconds: number; nanos: number } | null {
  if (seconds === undefined) return null;
  const whole = Math.floor(seconds);
  return { seconds: whole, nanos: Math.round((seconds - whole) * 1e9) };
}

export function timestamp(moment: Date | undefined): { seconds: number; nanos: number } | null {
  if (moment === undefined) return null;
  const millis = moment.getTime();
  return { seconds: Math.floor(millis / 1000), nanos: (millis % 1000) * 1e6 };
}

/** The bytes of a Buffer, as the Uint8Array they are (no copy). */
const view = (bytes: Buffer): Uint8Array => new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);

export const randomId = (): string => globalThis.crypto.randomUUID();

/** The target, namespace and token of a client: what it is given, else the environment's
 * RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN, else the defaults (127.0.0.1:50051,
 * no namespace: the token's, no token). An empty string given is given: `namespace: ""`
 * leaves the namespace to the token, `token: ""` sends none. */
export function fromEnvironment(
  options: Pick<ClientOptions, "target" | "namespace" | "token">,
  env: Record<string, string | undefined> = process.env,
): { target: string; namespace: string; token: string } {
  return {
    target: options.target || env[TARGET_ENV] || DEFAULT_TARGET,
    namespace: options.namespace ?? env[NAMESPACE_ENV] ?? "",
    token: options.token ?? env[TOKEN_ENV] ?? "",
  };
}

/** The channel of a client and the calls on it. */
export class Connection {
  readonly target: string;
  namespace: string;
  protected readonly timeoutMs: number;
  protected readonly metadata: grpc.Metadata;
  protected readonly channel: grpc.Client;
  /** Where each event a watch yielded left it (TranscriptCalls.watchPosition). */
  protected readonly positions = new WeakMap<object, WatchPosition>();

  constructor(services: DescService[], options: ClientOptions = {}) {
    const { target, namespace, token } = fromEnvironment(options);
    this.target = target;
    const credentials = options.credentials ?? grpc.credentials.createInsecure();
    this.channel = new grpc.Client(this.target, credentials, serviceConfig(services, options.maxAttempts ?? 3));
    this.namespace = namespace;
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.metadata = new grpc.Metadata();
    if (token) this.metadata.set("authorization", `Bearer ${token}`);
  }

  /** Close the channel. */
  close(): void {
    this.channel.close();
  }

  /** The typed error of a failed call, ErrorInfo and the other details decoded. */
  toError(error: grpc.ServiceError): RunifoldError {
    let reason = grpc.status[error.code] ?? "UNKNOWN";
    let metadata: Record<string, string> = {};
    const details: Detail[] = [];
    const raw = error.metadata?.get("grpc-status-details-bin")?.[0];
    if (raw instanceof Buffer) {
      for (const detail of statusDetails(new Uint8Array(raw))) {
        if (detail.typeName === "google.rpc.ErrorInfo") {
          reason = detail.value.reason;
          metadata = detail.value.metadata ?? {};
        } else {
          details.push(detail);
        }
      }
    }
    const Class = BY_REASON[reason] ?? BY_CODE[error.code] ?? RunifoldError;
    if (error.code === grpc.status.UNAVAILABLE && reason === "UNAVAILABLE") {
      // No ErrorInfo: the call reached no Runifold server (nothing listens there, the
      // network, a port that does not speak gRPC). Say where the client called, once.
      const found = new Unavailable(error.code, reason, `cannot reach ${this.target}: ${error.details}`, metadata, details);
      found.target = this.target;
      return found;
    }
    return new Class(error.code, reason, error.details, metadata, details);
  }

  protected ns(options: CallOptions | undefined): string {
    return options?.namespace ?? this.namespace;
  }

  protected deadline(options: CallOptions | undefined): Date {
    return new Date(Date.now() + (options?.timeoutMs ?? this.timeoutMs));
  }

  protected unary<Req, Res>(rpc: Rpc<Req, Res>, request: Req, options?: CallOptions): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      this.channel.makeUnaryRequest(
        rpc.path,
        (value: Req) => encode(rpc.input, value),
        (bytes: Buffer) => decode(rpc.output, view(bytes))[0] as Res,
        request,
        this.metadata,
        { deadline: this.deadline(options) },
        (error, reply) => {
          if (error) reject(this.toError(error));
          else resolve(reply as Res);
        },
      );
    });
  }

  /** A server stream of replies; `read` makes what it yields of each (its object, and the
   * message itself for what the object cannot hold exactly). */
  protected stream<Req, Res, Item = Res>(
    rpc: Rpc<Req, Res>,
    request: Req,
    options: { deadline?: Date },
    read: (object: Res, message: any) => Item = (object) => object as unknown as Item,
  ): grpc.ClientReadableStream<Item> {
    return this.channel.makeServerStreamRequest(
      rpc.path,
      (value: Req) => encode(rpc.input, value),
      (bytes: Buffer) => {
        const [object, message] = decode(rpc.output, view(bytes));
        return read(object as Res, message);
      },
      request,
      this.metadata,
      options,
    );
  }

  protected async *pages<Page, Item>(
    fetch: (token: string) => Promise<Page>,
    items: (page: Page) => Item[],
    next: (page: Page) => string,
  ): AsyncGenerator<Item> {
    let token = "";
    do {
      const page = await fetch(token);
      yield* items(page);
      token = next(page);
    } while (token);
  }
}

/** Channel options: gRPC's retry policy (UNAVAILABLE only) for every method but Summarize and ProposeMemories. */
function serviceConfig(services: DescService[], maxAttempts: number): grpc.ChannelOptions {
  if (maxAttempts < 2) return { "grpc.enable_retries": 0 };
  const names = services
    .flatMap((service) => service.methods.map((method: DescMethod) => [service.typeName, method.name]))
    .filter(([service, method]) => !NOT_RETRIED.has(`${service}/${method}`))
    .map(([service, method]) => ({ service, method }));
  const config = {
    methodConfig: [
      {
        name: names,
        retryPolicy: {
          maxAttempts: Math.min(maxAttempts, 5),
          initialBackoff: "0.1s",
          maxBackoff: "2s",
          backoffMultiplier: 2,
          retryableStatusCodes: ["UNAVAILABLE"],
        },
      },
    ],
  };
  return { "grpc.enable_retries": 1, "grpc.service_config": JSON.stringify(config) };
}
