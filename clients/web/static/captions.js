// A long recording transcribed on the page: segments appear as the server finishes them, then the
// subtitle files can be downloaded. The gateway answers newline-delimited JSON (clients/web/captions.py).
// Words the model is unsure of are underlined, as in the attention view.
import { markConfidence } from "./attention.js";

const $ = (id) => document.getElementById(id);

function clock(seconds) {
  const s = Math.floor(seconds);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

// Each line of a streamed body, parsed, as it arrives.
async function* lines(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value;
    const parts = pending.split("\n");
    pending = parts.pop();
    for (const part of parts) if (part.trim()) yield JSON.parse(part);
  }
  if (pending.trim()) yield JSON.parse(pending);
}

function showSegment(segment) {
  const list = $("segments");
  const item = document.createElement("li");
  item.dataset.index = segment.index;
  item.append(`${clock(segment.start_seconds)}–${clock(segment.end_seconds)}  `, ...withWords(segment));
  // Segments finish in any order: keep the list in time order.
  const later = [...list.children].find((other) => Number(other.dataset.index) > segment.index);
  list.insertBefore(item, later || null);
  $("long-progress").max = segment.count;
  $("long-progress").value = list.children.length;
  $("long-status").textContent = `${list.children.length} of ${segment.count} segments transcribed`;
}

// The segment's text as it was written, each of its words a span marked with its confidence.
function withWords(segment) {
  const parts = [];
  const spans = [];
  let at = 0;
  for (const word of segment.words) {
    const found = segment.text.indexOf(word.word, at);
    if (found < 0) return [segment.text]; // words that do not spell the text: the text alone
    if (found > at) parts.push(segment.text.slice(at, found));
    spans.push(Object.assign(document.createElement("span"), { textContent: word.word }));
    parts.push(spans.at(-1));
    at = found + word.word.length;
  }
  if (at < segment.text.length) parts.push(segment.text.slice(at));
  markConfidence(spans, segment.words);
  return parts;
}

function offer(id, text, type) {
  const link = $(id);
  link.href = URL.createObjectURL(new Blob([text], { type }));
  link.hidden = false;
}

// `options`: more of the gateway's query (the hotwords).
export async function transcribeLong(model, file, report, options = {}) {
  $("segments").replaceChildren();
  for (const id of ["download-srt", "download-vtt"]) $(id).hidden = true;
  $("long-result").hidden = false;
  $("long-progress").removeAttribute("value");
  $("long-status").textContent = `uploading ${file.name}…`;
  const base = file.name.replace(/\.[^.]*$/, "") || "transcript";
  let response;
  try {
    response = await fetch(`/api/transcribe?${new URLSearchParams({ model, ...options })}`, {
      method: "POST", body: file, headers: { "Content-Type": file.type || "application/octet-stream" },
    });
  } catch {
    report(new Error("cannot reach the gateway: is `attnserve web` still running?"));
    return;
  }
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    const error = body && body.error;
    report(new Error(error ? `${error.code}: ${error.message}` : `the gateway answered ${response.status}`));
    return;
  }
  $("long-status").textContent = "transcribing…";
  for await (const line of lines(response)) {
    if (line.segment) showSegment(line.segment);
    if (line.error) report(new Error(`${line.error.code}: ${line.error.message}`));
    if (line.result) {
      if (!line.result.segments.length) $("segments").replaceChildren(Object.assign(document.createElement("li"),
        { textContent: line.result.text }));
      $("long-status").textContent = `done: ${line.result.words.length} words in ${line.result.timings.total_seconds.toFixed(1)} s`;
      $("long-progress").max = 1;
      $("long-progress").value = 1;
      $("download-srt").download = `${base}.srt`;
      $("download-vtt").download = `${base}.vtt`;
      offer("download-srt", line.srt, "application/x-subrip");
      offer("download-vtt", line.vtt, "text/vtt");
      document.body.dataset.transcribed = "true";
    }
  }
}
