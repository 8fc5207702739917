// The demo page: pick a model, give it text, audio or an image (or a sample), show the answer with its
// attention; choose the layer and heads, compare the translators, save a PNG, link to the view.
import { columnLabels, onKey, pin, pinned, show } from "./attention.js";
import { transcribeLong } from "./captions.js";
import { showComparison } from "./compare.js";
import { exportPng } from "./matrix.js";
import { blobToWav } from "./wav.js";

const $ = (id) => document.getElementById(id);
const INPUTS = { text: "text-input", audio: "audio-input", image: "image-input", video: "video-input" };
const FINISH = { eos: "complete", length: "stopped at the length limit" };
let models = [];
let recorder = null;
let samples = { text: { zh: [], en: [] }, scenes: [] };
let last = null; // {query, body, type, image, result}: the request shown, to rerun with other attention

async function api(path, options = {}) {
  const token = sessionStorage.getItem("attnserve-token");
  const headers = { ...(options.headers || {}), ...(token ? { Authorization: `Bearer ${token}` } : {}) };
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch {
    throw new Error("cannot reach the gateway: is `attnserve web` still running?");
  }
  const body = await response.json().catch(() => null);
  if (response.status === 401 && path.startsWith("/api/")) {
    const entered = prompt("This gateway needs a token:");
    if (entered) {
      sessionStorage.setItem("attnserve-token", entered.trim());
      return api(path, options);
    }
  }
  if (!response.ok) {
    const error = body && body.error;
    throw new Error(error ? `${error.code}: ${error.message}` : `the gateway answered ${response.status}`);
  }
  return body;
}

function report(error) {
  $("error").textContent = error.message;
  $("error").hidden = false;
  $("status").textContent = "";
}

function attentionQuery() {
  const heads = [...$("heads").querySelectorAll("input:checked")].map((box) => box.value);
  return { ...($("layer").value !== "" && { layer: $("layer").value }), ...(heads.length && { heads: heads.join(",") }) };
}

async function run(query, body, type, image) {
  $("error").hidden = true;
  $("status").textContent = "working…";
  const full = { ...query, ...attentionQuery() };
  try {
    const result = await api(`/api/generate?${new URLSearchParams(full)}`, {
      method: "POST", body, headers: { "Content-Type": type },
    });
    const keep = pinned();
    show(result, image);
    $("result").hidden = false;
    last = { query, body, type, image, result };
    $("status").textContent = statusLine(result);
    if (keep !== null && keep < result.attention.row_labels.length) pin(keep);
  } catch (error) {
    report(error);
  }
}

function statusLine(result) {
  const t = result.timings;
  const words = result.attention ? result.attention.row_labels.length : result.tokens.length;
  const into = selected().input_kind === "text" ? ` into ${result.target_language}` : "";
  const placed = result.glossary.filter((g) => g.output_start >= 0).length;
  const terms = result.glossary.length ? `, ${placed} of ${result.glossary.length} glossary terms placed` : "";
  const finish = FINISH[result.finish_reason] ?? result.finish_reason;
  return `${result.model}: ${words} words${into} in ${t.total_seconds.toFixed(2)} s, ${finish}${terms}`;
}

function selected() {
  return models.find((m) => m.name === $("model").value);
}

function chooseModel() {
  const model = selected();
  for (const [kind, id] of Object.entries(INPUTS)) $(id).hidden = model.input_kind !== kind;
  $("model-description").textContent = model.description;
  const options = model.target_languages.map((code) => new Option(code, code));
  if (model.target_languages.length > 1) options.unshift(new Option("the other language", ""));
  $("to").replaceChildren(...options);
  const layers = [...Array(model.attention_layers).keys()].map((l) => new Option(`layer ${l}`, String(l)));
  $("layer").replaceChildren(new Option("the model's choice", ""), ...layers);
  $("heads").replaceChildren(...[...Array(model.attention_heads).keys()].map(headBox));
  $("compare").hidden = translators().length < 2;
  $("glossary-choice").hidden = !model.glossary_terms;
  if (!model.glossary_terms) $("glossary").checked = false;
  fillSamples(model);
}

function headBox(h) {
  const label = document.createElement("label");
  const box = document.createElement("input");
  box.type = "checkbox";
  box.value = String(h);
  box.addEventListener("change", rerun);
  label.append(box, ` head ${h}`);
  return label;
}

function translators() {
  return models.filter((m) => m.input_kind === "text" && m.task === "translation");
}

function fillSamples(model) {
  let options = [];
  if (model.input_kind === "text") {
    options = [...samples.text.zh, ...samples.text.en].map((text) => new Option(text, text));
  } else if (model.input_kind === "image") {
    options = samples.scenes.map((s) => new Option(`scene: ${s.drawn}`, `/static/samples/${s.file}`));
  }
  $("samples").replaceChildren(new Option(options.length ? "choose…" : "none for this model", ""), ...options);
}

async function useSample() {
  const value = $("samples").value;
  if (!value) return;
  if (selected().input_kind === "text") {
    $("text").value = value;
    translate();
  } else {
    const blob = await (await fetch(value)).blob();
    sendImage(blob);
  }
}

function rerun() {
  if (last) run(last.query, last.body, last.type, last.image);
}

function translate(event) {
  event?.preventDefault();
  const query = { model: $("model").value, to: $("to").value, ...($("glossary").checked && { glossary: "1" }) };
  run(query, JSON.stringify({ text: $("text").value }), "application/json");
}

async function compare() {
  $("error").hidden = true;
  $("status").textContent = "comparing…";
  const body = JSON.stringify({ text: $("text").value });
  const results = await Promise.all(translators().map(async (m) => {
    const query = new URLSearchParams({ model: m.name, to: $("to").value, ...($("glossary").checked && { glossary: "1" }) });
    try {
      return { model: m.name, result: await api(`/api/generate?${query}`, {
        method: "POST", body, headers: { "Content-Type": "application/json" },
      }) };
    } catch (error) {
      return { model: m.name, error };
    }
  }));
  showComparison($("panels"), results);
  $("compare-view").hidden = false;
  $("status").textContent = `compared ${results.length} translators`;
}

// The player's duration once it has read the file's header (0 when it cannot read it).
function duration(player) {
  return new Promise((resolve) => {
    if (player.readyState >= 1) resolve(player.duration);
    player.onloadedmetadata = () => resolve(player.duration);
    player.onerror = () => resolve(0);
  });
}

// The hotwords typed for the recording, as the gateway's query parameter (none when the field is empty).
function hotwordsQuery() {
  const words = $("hotwords").value.trim();
  return words ? { hotwords: words } : {};
}

// A clip within the model's window shows its attention; a longer one (a lecture into the microphone)
// goes the long-recording way, segment by segment, when the server cuts long recordings.
async function sendAudio(blob, name = "recording.wav") {
  $("player").src = URL.createObjectURL(blob);
  $("player").hidden = false;
  const { audio } = selected();
  if (audio.long_form_max_seconds && (await duration($("player"))) > audio.max_seconds) {
    $("result").hidden = true;
    $("error").hidden = true;
    transcribeLong($("model").value, new File([blob], name, { type: blob.type || "audio/wav" }), report, hotwordsQuery());
    return;
  }
  run({ model: $("model").value, ...hotwordsQuery() }, blob, "audio/wav");
}

async function toggleRecording() {
  if (recorder) {
    recorder.stop();
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const chunks = [];
    recorder = new MediaRecorder(stream);
    recorder.ondataavailable = (event) => chunks.push(event.data);
    recorder.onstop = async () => {
      stream.getTracks().forEach((track) => track.stop());
      recorder = null;
      $("record").textContent = "● Record";
      $("record").classList.remove("recording");
      try {
        sendAudio(await blobToWav(new Blob(chunks, { type: chunks[0]?.type })));
      } catch {
        report(new Error("the recording could not be decoded by this browser"));
      }
    };
    recorder.start();
    $("record").textContent = "■ Stop";
    $("record").classList.add("recording");
  } catch (error) {
    report(new Error(`cannot record: ${error.message}`));
  }
}

function sendImage(file) {
  if (!file) return;
  const { width, height } = selected().image;
  run({ model: $("model").value }, file, file.type || "image/png", { url: URL.createObjectURL(file), width, height });
}

function sendVideo(file) {
  if (!file) return;
  const { width, height } = selected().video;
  const gif = file.type === "image/gif"; // sent as video/gif, so the gateway routes it to the video model
  run({ model: $("model").value }, file, gif ? "video/gif" : file.type || "video/mp4",
    { url: URL.createObjectURL(file), width, height, gif });
}

// The view as a link: model, text, target language, layer and heads in the fragment (text models).
function permalink() {
  const state = { model: $("model").value, ...attentionQuery() };
  if (selected().input_kind === "text") Object.assign(state, { text: $("text").value, to: $("to").value });
  if ($("glossary").checked) state.glossary = "1";
  const url = `${location.origin}${location.pathname}#${new URLSearchParams(state)}`;
  history.replaceState(null, "", url);
  $("link").value = url;
  $("link").hidden = false;
  $("link").select();
  navigator.clipboard?.writeText(url).catch(() => undefined);
}

function restore() {
  const state = new URLSearchParams(location.hash.slice(1));
  if (!models.some((m) => m.name === state.get("model"))) return false;
  $("model").value = state.get("model");
  chooseModel();
  if (state.has("layer")) $("layer").value = state.get("layer");
  for (const h of (state.get("heads") || "").split(",").filter(Boolean)) {
    const box = $("heads").querySelector(`input[value="${h}"]`);
    if (box) box.checked = true;
  }
  if (state.has("text") && selected().input_kind === "text") {
    $("text").value = state.get("text");
    if (state.has("to")) $("to").value = state.get("to");
    $("glossary").checked = state.get("glossary") === "1" && !$("glossary-choice").hidden;
    translate();
  }
  return true;
}

async function start() {
  try {
    models = await api("/api/models");
    samples = {
      text: await (await fetch("/static/samples/text.json")).json(),
      scenes: await (await fetch("/static/samples/scenes.json")).json(),
    };
  } catch (error) {
    report(error);
    return;
  }
  $("model").replaceChildren(...models.map((m) => new Option(`${m.name} (${m.task})`, m.name)));
  // A lecture starts with the translator: the bundled Transformer if served, else the first translator.
  const first = translators().find((m) => m.name === "translate-zh-en") ?? translators()[0] ?? models[0];
  $("model").value = first.name;
  chooseModel();
  restore();
  $("model").addEventListener("change", chooseModel);
  $("request").addEventListener("submit", translate);
  $("samples").addEventListener("change", useSample);
  $("layer").addEventListener("change", rerun);
  $("compare").addEventListener("click", compare);
  $("record").addEventListener("click", toggleRecording);
  $("audio-file").addEventListener("change", () => {
    const file = $("audio-file").files[0];
    if (file) sendAudio(file, file.name);
  });
  $("image-file").addEventListener("change", () => sendImage($("image-file").files[0]));
  $("video-file").addEventListener("change", () => sendVideo($("video-file").files[0]));
  $("long-file").addEventListener("change", () => {
    const file = $("long-file").files[0];
    if (file) {
      $("error").hidden = true;
      transcribeLong($("model").value, file, report, hotwordsQuery());
    }
  });
  $("export").addEventListener("click", () => last && exportPng(last.result, columnLabels(last.result), statusLine(last.result)));
  $("permalink").addEventListener("click", permalink);
  document.addEventListener("keydown", onKey);
  document.body.dataset.ready = "true";
}

start();
