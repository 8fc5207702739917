// The attnserve HTTP/JSON API (docs/http-api.md) from a browser or Node 20+, with nothing but `fetch`.
//
//     const client = new AttnServeClient("http://127.0.0.1:8080", { token });
//     const result = await client.translate("知識就是力量", { to: "en", attention: true });
//     for await (const event of client.stream(request)) { ... }   // token events, then { response }
//
// Requests and answers are the proto's messages in protobuf's JSON mapping; their types (./types.ts) are
// generated from the gateway's OpenAPI document. A failed call throws AttnServeError with the gRPC status
// name the gateway answers (e.g. "INVALID_ARGUMENT") and the server's message.
import type {
  GenerateRequest,
  GenerateResponse,
  GenerateStreamResponse,
  ListModelsResponse,
  ModelInfo,
} from "./types.js";

export type * from "./types.js";

/** A failed call: the gRPC status name, the server's message and the HTTP status. */
export class AttnServeError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
  ) {
    super(`${code}: ${message}`);
    this.name = "AttnServeError";
  }
}

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <token>` (the gateway's --http-token-file). */
  token?: string;
  /** Milliseconds per call (a stream: until its last event); undefined = no limit. */
  timeoutMs?: number;
  /** Another fetch (tests, proxies); default: the global one. */
  fetch?: typeof fetch;
}

/** translate()'s options: the common ones by name; anything else through `request`. */
export interface TranslateOptions {
  model?: string;
  /** Target language, e.g. "en" or "zh-TW"; unset = the server chooses the language the text is not in. */
  to?: string;
  attention?: boolean;
  granularity?: "words" | "pieces";
  layer?: number;
  heads?: number[];
  beamSize?: number;
  /** Fields merged into the request last (decoding options, request id, ...). */
  request?: Partial<GenerateRequest>;
}

export const DEFAULT_MODEL = "translate-zh-en";

export class AttnServeClient {
  private readonly base: string;
  private readonly fetcher: typeof fetch;

  /** `baseUrl` is the gateway's, e.g. "http://127.0.0.1:8080" (its /v1/ routes are used). */
  constructor(
    baseUrl: string,
    private readonly options: ClientOptions = {},
  ) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  async listModels(): Promise<ModelInfo[]> {
    const body = (await this.json("GET", "/v1/models")) as ListModelsResponse;
    return body.models;
  }

  async getModel(name: string): Promise<ModelInfo> {
    return (await this.json("GET", `/v1/models/${encodeURIComponent(name)}`)) as ModelInfo;
  }

  /** Runs one request to completion (gRPC Generate). */
  async generate(request: GenerateRequest): Promise<GenerateResponse> {
    return (await this.json("POST", "/v1/generate", request)) as GenerateResponse;
  }

  /** Translates `text`: a GenerateRequest built from the options, then generate(). */
  async translate(text: string, options: TranslateOptions = {}): Promise<GenerateResponse> {
    return this.generate(translationRequest(text, options));
  }

  /** Yields one event per generated token, then `{ response }`, the whole answer (gRPC GenerateStream). */
  async *stream(request: GenerateRequest): AsyncGenerator<GenerateStreamResponse> {
    const response = await this.call("POST", "/v1/generate/stream", request, "application/x-ndjson");
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += value;
        const lines = pending.split("\n");
        pending = lines.pop()!;
        for (const line of lines.filter((l) => l.trim())) yield eventOf(line, response.status);
      }
      if (pending.trim()) yield eventOf(pending, response.status);
    } finally {
      await reader.cancel().catch(() => undefined); // leaving early cancels the request on the server
    }
  }

  private async json(method: string, path: string, body?: unknown): Promise<unknown> {
    return (await this.call(method, path, body, "application/json")).json();
  }

  private async call(method: string, path: string, body: unknown, accept: string): Promise<Response> {
    const headers: Record<string, string> = { Accept: accept };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (this.options.token) headers.Authorization = `Bearer ${this.options.token}`;
    const signal = this.options.timeoutMs === undefined ? undefined : AbortSignal.timeout(this.options.timeoutMs);
    let response: Response;
    try {
      response = await this.fetcher(this.base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
    } catch (error) {
      const timedOut = error instanceof DOMException && error.name === "TimeoutError";
      throw new AttnServeError(timedOut ? "DEADLINE_EXCEEDED" : "UNAVAILABLE", String(error), 0);
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }
}

/** The GenerateRequest translate() sends. */
export function translationRequest(text: string, options: TranslateOptions = {}): GenerateRequest {
  const request: GenerateRequest = { model: options.model ?? DEFAULT_MODEL, text: { text } };
  if (options.to) request.targetLanguage = options.to;
  if (options.beamSize) request.decoding = { beamSize: options.beamSize };
  if (options.attention) {
    request.attention = {
      mode: "ATTENTION_MODE_AGGREGATED",
      granularity: options.granularity === "pieces" ? "ATTENTION_GRANULARITY_PIECES" : "ATTENTION_GRANULARITY_WORDS",
      layer: options.layer,
      heads: options.heads,
    };
  }
  return { ...request, ...options.request };
}

/** Base64 of a file's bytes, for AudioInput.data and ImageInput.data (browsers and Node alike). */
export function base64Of(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

/** The attention matrix's weights as rows: rows[r][c] = attention of output row r on source column c. */
export function attentionRows(response: GenerateResponse): number[][] {
  const matrix = response.attention;
  if (!matrix) return [];
  return Array.from({ length: matrix.rows }, (_, r) => matrix.weights.slice(r * matrix.cols, (r + 1) * matrix.cols));
}

function eventOf(line: string, status: number): GenerateStreamResponse {
  const event = JSON.parse(line);
  if (event.error) throw new AttnServeError(event.error.code, event.error.message, status);
  return event as GenerateStreamResponse;
}

async function errorOf(response: Response): Promise<AttnServeError> {
  try {
    const { error } = await response.json();
    return new AttnServeError(error.code, error.message, response.status);
  } catch {
    return new AttnServeError("UNKNOWN", `HTTP ${response.status} ${response.statusText}`, response.status);
  }
}
