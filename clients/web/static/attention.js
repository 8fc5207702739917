// The interactive attention view: output words above, what they looked at below (source words, a time
// line of the audio with its axis, or cells over the image), and the full matrix. Pointing at output word i
// (hover, or focus) shades column j by weights[i][j] relative to the row's largest weight, and for audio
// marks the word's time span; for a clip it draws the word's timeline (its attention per frame) and shows its
// most-attended frame under the heatmap of its cells. A click or tap pins a word (hovering then changes nothing) and a second one
// lets go; with a word focused, ← and → pin the previous and next word, Home and End the first and last,
// Esc lets go.
import { legend, markRow, matrixTable } from "./matrix.js";

const $ = (id) => document.getElementById(id);
let view = null; // {attention, columns, words, end, pinned}

export function show(result, image) {
  const attention = result.attention;
  const kind = result.columns ? result.columns.kind : "none";
  const rows = attention ? attention.row_labels : result.tokens.map((t) => t.piece);
  $("output").replaceChildren(...rows.map((label, i) => word(label, { row: i })));
  if (result.words.length === rows.length) markConfidence([...$("output").children], result.words);
  for (const id of ["source", "columns", "cells", "time-axis", "matrix"]) $(id).replaceChildren();
  $("source").hidden = $("source-heading").hidden = kind !== "text";
  $("timeline").hidden = $("time-axis").hidden = kind !== "time";
  $("picture").hidden = kind !== "grid";
  $("clip").hidden = kind !== "frames";
  $("span-mark").style.display = "none";
  $("reduction").textContent = attention ? attention.reduction : "";

  let columns = [];
  if (kind === "text") {
    columns = attention.col_labels.map((label, j) => word(label, { col: j }));
    $("source").replaceChildren(...columns);
  } else if (kind === "time") {
    columns = timeColumns(result.columns.spans);
    $("columns").replaceChildren(...columns);
    $("time-axis").replaceChildren(...ticks(result.columns.spans.at(-1)[1]));
  } else if (kind === "grid") {
    $("image").src = image.url;
    columns = gridCells(result.columns.boxes, image.width, image.height, result.columns.first || 0);
    $("cells").replaceChildren(...columns);
  }
  const clip = kind === "frames" ? showClip(result.columns, image, result.frames) : null;
  view = null;
  if (!attention) return;
  matrixTable($("matrix"), attention, columnLabels(result));
  legend($("legend"));
  const end = kind === "time" ? result.columns.spans.at(-1)[1] : 0;
  view = { attention, columns, words: result.words, end, pinned: null, clip };
  for (const rows of result.glossary_rows || []) {
    for (const r of rows) $("output").children[r]?.classList.add("term");
  }
  for (const [i, element] of [...$("output").children].entries()) {
    element.tabIndex = i === 0 ? 0 : -1;
    element.setAttribute("role", "option");
    element.addEventListener("mouseenter", () => view.pinned === null && highlight(i));
    element.addEventListener("focus", () => view.pinned === null && highlight(i));
    element.addEventListener("click", () => pin(view.pinned === i ? null : i));
  }
}

// What each matrix column stands for, for people: the source word, the time span, the grid cell.
export function columnLabels(result) {
  const kind = result.columns ? result.columns.kind : "text";
  if (kind === "time") return result.columns.spans.map(([a, b]) => `${a.toFixed(2)}s`);
  if (kind === "grid") return result.attention.col_labels.map((label) => label.split(":")[0]);
  if (kind === "frames") return result.attention.col_labels.map((label) => label.split(":").slice(0, 2).join(" "));
  return result.attention.col_labels;
}

export function pin(i) {
  if (!view) return;
  view.pinned = i;
  for (const element of $("output").children) {
    const pinned = element.dataset.row === String(i);
    element.classList.toggle("pinned", pinned);
    element.setAttribute("aria-selected", String(pinned));
    element.tabIndex = pinned || (i === null && element.dataset.row === "0") ? 0 : -1;
  }
  if (i !== null) {
    highlight(i);
    $("output").children[i].focus({ preventScroll: true });
  }
}

export function onKey(event) {
  if (!view || !event.target.closest("#output")) return;
  const last = view.attention.row_labels.length - 1;
  const at = Number(event.target.dataset.row);
  const moves = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: last };
  if (event.key in moves) {
    pin(Math.min(last, Math.max(0, moves[event.key])));
  } else if (event.key === "Escape") {
    pin(null);
  } else if (event.key === "Enter" || event.key === " ") {
    pin(view.pinned === at ? null : at);
  } else {
    return;
  }
  event.preventDefault();
}

export function pinned() {
  return view ? view.pinned : null;
}

// Words the model gives less than even odds of being right (WordTiming.confidence, calibrated per model)
// are underlined; every word with a confidence says it on hover.
export const UNSURE = 0.5;

export function markConfidence(elements, words) {
  elements.forEach((element, i) => {
    const confidence = words[i].confidence;
    if (confidence === null || confidence === undefined) return;
    element.title = `${Math.round(confidence * 100)}% sure`;
    element.classList.toggle("unsure", confidence < UNSURE);
  });
}

function word(label, data) {
  const span = document.createElement("span");
  span.textContent = label;
  Object.assign(span.dataset, data);
  if ("col" in data) {
    span.classList.add("column");
    span.dataset.weight = "0";
  }
  return span;
}

function timeColumns(spans) {
  const end = spans.at(-1)[1];
  return spans.map(([start, stop], j) => {
    const cell = positioned({ left: start / end, width: (stop - start) / end });
    cell.title = `${start.toFixed(2)}–${stop.toFixed(2)} s`;
    cell.dataset.col = j;
    return cell;
  });
}

// Tick marks under the time line: the largest step of 0.1, 0.2, 0.5, 1, 2, 5 or 10 s that gives 4 to 10 ticks.
function ticks(end) {
  const step = [0.1, 0.2, 0.5, 1, 2, 5, 10].find((s) => end / s <= 10) ?? 10;
  const marks = [];
  for (let t = 0; t <= end + 1e-9; t += step) {
    const tick = positioned({ left: t / end });
    tick.className = "tick";
    tick.textContent = `${Number(t.toFixed(1))} s`;
    marks.push(tick);
  }
  return marks;
}

// first: the attention column of the first cell (a ViT's "cls" column comes before the cells).
function gridCells(boxes, width, height, first = 0) {
  return boxes.map(([x0, y0, x1, y1], j) => {
    const cell = positioned({ left: x0 / width, top: y0 / height, width: (x1 - x0) / width, height: (y1 - y0) / height });
    cell.dataset.col = j + first;
    return cell;
  });
}

function positioned(fractions) {
  const cell = document.createElement("div");
  cell.classList.add("column");
  cell.dataset.weight = "0";
  for (const [side, fraction] of Object.entries(fractions)) cell.style[side] = `${(fraction * 100).toFixed(3)}%`;
  return cell;
}

function highlight(i) {
  const { attention, columns, words, end, clip } = view;
  if (clip) highlightFrames(i, clip);
  const row = attention.weights[i];
  for (const element of $("output").children) element.classList.toggle("active", element.dataset.row === String(i));
  markRow($("matrix"), i);
  const peak = Math.max(...row) || 1;
  columns.forEach((element) => {
    const w = row[Number(element.dataset.col)];
    element.dataset.weight = w.toFixed(4);
    element.style.setProperty("--w", (w / peak).toFixed(3));
  });
  const mark = $("span-mark");
  const timing = words[i];
  if (timing && end) {
    mark.style.left = `${((timing.start_seconds / end) * 100).toFixed(3)}%`;
    mark.style.width = `${(((timing.end_seconds - timing.start_seconds) / end) * 100).toFixed(3)}%`;
    mark.style.display = "block";
  } else {
    mark.style.display = "none";
  }
}

// A clip: one bar per sampled frame (the timeline) and the frame itself (the video seeked to its time, or
// the animated GIF) under one frame's grid of cells. Returns what highlightFrames needs.
function showClip(columns, media, frames) {
  const video = $("clip-video");
  $("clip-gif").hidden = !media.gif;
  video.hidden = media.gif;
  if (media.gif) $("clip-gif").src = media.url;
  else video.src = media.url;
  const bars = columns.times.map((t) => {
    const bar = document.createElement("div");
    bar.title = `${t.toFixed(2)} s`;
    return bar;
  });
  const cells = gridCells(columns.boxes, media.width, media.height);
  $("frame-bars").replaceChildren(...bars);
  $("frame-cells").replaceChildren(...cells);
  return { bars, cells, frames };
}

function highlightFrames(i, { bars, cells, frames }) {
  const frame = frames[i];
  const most = Math.max(...frame.timeline) || 1;
  bars.forEach((bar, t) => {
    bar.style.height = `${((frame.timeline[t] / most) * 100).toFixed(1)}%`;
    bar.classList.toggle("peak", t === frame.peak_frame);
  });
  const peak = Math.max(...frame.heatmap) || 1;
  cells.forEach((cell, j) => {
    cell.dataset.weight = frame.heatmap[j].toFixed(4);
    cell.style.setProperty("--w", (frame.heatmap[j] / peak).toFixed(3));
  });
  const seconds = frame.frame_seconds[frame.peak_frame];
  if (!$("clip-video").hidden) $("clip-video").currentTime = seconds;
  $("frame-label").textContent = `${frame.word}: frame ${frame.peak_frame + 1} of ${frame.timeline.length} ` +
    `(${seconds.toFixed(2)} s), ${(frame.timeline[frame.peak_frame] * 100).toFixed(0)}% of its attention`;
}
