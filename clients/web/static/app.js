// The demo page: pick a model, give it text, audio or an image, show the answer with its attention.
import { show } from "./attention.js";
import { transcribeLong } from "./captions.js";
import { blobToWav } from "./wav.js";

const $ = (id) => document.getElementById(id);
const INPUTS = { text: "text-input", audio: "audio-input", image: "image-input", video: "video-input" };
let models = [];
let recorder = null;

async function api(path, options) {
  let response;
  try {
    response = await fetch(path, options);
  } catch {
    throw new Error("cannot reach the gateway: is `attnserve web` still running?");
  }
  const body = await response.json().catch(() => null);
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

async function run(query, body, type, image) {
  $("error").hidden = true;
  $("status").textContent = "working…";
  try {
    const result = await api(`/api/generate?${new URLSearchParams(query)}`, {
      method: "POST", body, headers: { "Content-Type": type },
    });
    show(result, image);
    $("result").hidden = false;
    $("status").textContent = `${result.model}: ${result.finish_reason}, ${result.timings.total_seconds.toFixed(2)} s`;
  } catch (error) {
    report(error);
  }
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
}

function translate(event) {
  event.preventDefault();
  run({ model: $("model").value, to: $("to").value }, JSON.stringify({ text: $("text").value }), "application/json");
}

// The player's duration once it has read the file's header (0 when it cannot read it).
function duration(player) {
  return new Promise((resolve) => {
    if (player.readyState >= 1) resolve(player.duration);
    player.onloadedmetadata = () => resolve(player.duration);
    player.onerror = () => resolve(0);
  });
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
    transcribeLong($("model").value, new File([blob], name, { type: blob.type || "audio/wav" }), report);
    return;
  }
  run({ model: $("model").value }, blob, "audio/wav");
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

function sendImage() {
  const file = $("image-file").files[0];
  if (!file) return;
  const { width, height } = selected().image;
  run({ model: $("model").value }, file, file.type || "image/png", { url: URL.createObjectURL(file), width, height });
}

function sendVideo() {
  const file = $("video-file").files[0];
  if (!file) return;
  const { width, height } = selected().video;
  const gif = file.type === "image/gif";  // sent as video/gif, so the gateway routes it to the video model
  run({ model: $("model").value }, file, gif ? "video/gif" : file.type || "video/mp4",
    { url: URL.createObjectURL(file), width, height, gif });
}

async function start() {
  try {
    models = await api("/api/models");
  } catch (error) {
    report(error);
    return;
  }
  $("model").replaceChildren(...models.map((m) => new Option(`${m.name} (${m.task})`, m.name)));
  chooseModel();
  $("model").addEventListener("change", chooseModel);
  $("request").addEventListener("submit", translate);
  $("record").addEventListener("click", toggleRecording);
  $("audio-file").addEventListener("change", () => {
    const file = $("audio-file").files[0];
    if (file) sendAudio(file, file.name);
  });
  $("image-file").addEventListener("change", sendImage);
  $("video-file").addEventListener("change", sendVideo);
  $("long-file").addEventListener("change", () => {
    const file = $("long-file").files[0];
    if (file) {
      $("error").hidden = true;
      transcribeLong($("model").value, file, report);
    }
  });
  document.body.dataset.ready = "true";
}

start();
