// The client against a live gateway and server (tests/test_js_client.py starts both on loopback and runs
// `npm test` with ATTNSERVE_URL set, and ATTNSERVE_EXPECTED naming a JSON file of what the Python gRPC
// client got for the same requests: the answers here must be the same).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { AttnServeClient, AttnServeError, attentionRows, base64Of, translationRequest } from "../src/index.js";

const url = process.env.ATTNSERVE_URL;
const expected = url ? JSON.parse(readFileSync(process.env.ATTNSERVE_EXPECTED!, "utf8")) : undefined;
const skip = url ? false : "set ATTNSERVE_URL to a running gateway (tests/test_js_client.py does)";
const client = new AttnServeClient(url ?? "http://127.0.0.1:1", { token: process.env.ATTNSERVE_TOKEN, timeoutMs: 60_000 });

test("lists the served models", { skip }, async () => {
  const models = await client.listModels();
  assert.deepEqual(models.map((m) => m.name), expected.models);
  const info = await client.getModel(expected.text.model);
  assert.equal(info.inputKind, "INPUT_KIND_TEXT");
  assert.ok(info.attentionHeads > 0 && info.targetLanguages.length > 0);
});

test("translates as the gRPC client does, with the attention matrix", { skip }, async () => {
  const { model, text, to, layer, heads } = expected.text;
  const result = await client.translate(text, { model, to, attention: true, layer, heads, granularity: "pieces" });
  assert.equal(result.text, expected.text.response.text);
  assert.deepEqual(result.tokens, expected.text.response.tokens);
  // Weights are float32 on the wire: equal as float32, whichever decimal digits each side printed.
  const float32 = (rows: number[][]) => rows.map((row) => row.map(Math.fround));
  assert.deepEqual(float32(attentionRows(result)), float32(expected.text.rows));
  assert.equal(result.attention!.layer, layer);
});

test("a stream's tokens add up to its final response", { skip }, async () => {
  const { model, text, to } = expected.text;
  const request = translationRequest(text, { model, to, attention: true, request: { decoding: { beamSize: 1 } } });
  const events = [];
  for await (const event of client.stream(request)) events.push(event);
  const final = events.pop()!.response!;
  assert.equal(events.map((e) => e.token!.text).join(""), final.text);
  assert.deepEqual(events.map((e) => e.token!.index), final.tokens.map((_, i) => i));
  assert.equal(final.text, (await client.generate(request)).text);
});

test("audio goes as base64", { skip }, async () => {
  const { model, wav } = expected.audio;
  const bytes = Uint8Array.from(Buffer.from(wav, "base64"));
  const result = await client.generate({ model, audio: { data: base64Of(bytes) } });
  assert.equal(result.text, expected.audio.text);
});

test("a refused request throws the server's status and message", { skip }, async () => {
  await assert.rejects(client.translate("abc", { model: "nope" }), (error: unknown) => {
    assert.ok(error instanceof AttnServeError);
    assert.equal(error.code, "NOT_FOUND");
    assert.equal(error.status, 404);
    assert.match(error.message, /unknown model 'nope'/);
    return true;
  });
  const wrong = new AttnServeClient(url!, { token: "wrong" });
  await assert.rejects(wrong.listModels(), { code: "UNAUTHENTICATED", status: 401 });
});

test("an unreachable gateway is UNAVAILABLE", async () => {
  const nowhere = new AttnServeClient("http://127.0.0.1:1");
  await assert.rejects(nowhere.listModels(), { code: "UNAVAILABLE" });
});
